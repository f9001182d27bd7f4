"""After contention: auto mode once another process has held the cores, beside fixed `ar`.

    python scripts/after_contention.py [--concurrency 64] [--hog-s 10] [--runs 4] [--rounds 2]

Per mode (auto, then ar; the order alternates between rounds): start the services, serve the
bench's closed loop for --hog-s with a busy process per core beside them (what a noisy
neighbour, a compaction or a log rotation does to a host), stop those, then make --runs
measured runs back to back. Printed per run: tokens a second and the layouts of its verify
steps; at the end, per run index, auto over ar (median and range over the rounds). An auto
mode that keeps what it chose under contention shows as low ratios in the first runs.
Throughput is the bench's (bundled pair, --max-tokens per request, EOS ignored).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import statistics
import subprocess
import sys
import time
from collections import Counter

from minedraft.bench.driver import run_workload, warm_up
from minedraft.bench.main import add_parser, settled_newest_step, steps_after, workload_for
from minedraft.bench.runs import mode_ks, serve_config
from minedraft.client import Client
from minedraft.launcher import Cluster

MODES = ("auto", "ar")


def busy_processes(count: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def one_mode(mode: str, bench: argparse.Namespace, args: argparse.Namespace) -> list[float]:
    """-> tokens a second of each measured run after the contention."""
    workload = workload_for(args.concurrency, bench)
    prompts, tokens = workload.prompts, bench.max_tokens
    config = dataclasses.replace(serve_config(mode, mode_ks(mode, bench)[0], args.concurrency, bench),
                                 log_level=args.log_level)
    rates = []
    with Cluster(config) as cluster:
        busy = busy_processes(os.cpu_count() or 1)
        try:
            asyncio.run(warm_up(cluster.address, prompts, tokens, bench.ignore_eos, args.concurrency, args.hog_s))
        finally:
            for process in busy:
                process.kill()
                process.wait()
        start = time.perf_counter()
        for run in range(args.runs):
            with Client(cluster.address, timeout=600) as client:
                before = settled_newest_step(client)
            _, wall = asyncio.run(run_workload(cluster.address, prompts, tokens, bench.ignore_eos,
                                               args.concurrency, None, mode))
            with Client(cluster.address, timeout=600) as client:
                steps = steps_after(client, before)
            layouts = Counter(step.get("layout", "?") for step in steps if step.get("kind") == "verify")
            rates.append(len(prompts) * tokens / wall)
            print(f"  {mode:4} run {run} ({time.perf_counter() - start:5.1f} s after): "
                  f"{rates[-1]:6.0f} tok/s, verify steps {dict(layouts)}", flush=True)
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--hog-s", type=float, default=10.0, help="seconds served beside the busy processes")
    parser.add_argument("--runs", type=int, default=4, help="measured runs after them")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--log-level", default="WARNING",
                        help="the services' (INFO: the gateway logs each of auto's switches and why)")
    args = parser.parse_args()
    bench = add_parser(argparse.ArgumentParser().add_subparsers()).parse_args(["--concurrency", str(args.concurrency)])

    rates: dict[str, list[list[float]]] = {mode: [] for mode in args.modes}
    for round_ in range(args.rounds):
        for mode in (args.modes if round_ % 2 == 0 else args.modes[::-1]):
            print(f"round {round_ + 1}/{args.rounds}, {mode}: {args.hog_s:g} s beside "
                  f"{os.cpu_count()} busy processes, then {args.runs} runs", flush=True)
            rates[mode].append(one_mode(mode, bench, args))
    if set(rates) != set(MODES):
        return
    print("\nauto / ar per run after the contention (median, range over rounds):")
    for run in range(args.runs):
        ratios = [auto[run] / ar[run] for auto, ar in zip(rates["auto"], rates["ar"])]
        print(f"  run {run}: {statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main()
