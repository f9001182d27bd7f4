"""`minedraft bench`: every mode on the same prompts, hardware and concurrency, in one run.

Modes: ar; sd (drafter on its own device: the fair baseline, same devices as psd, no
overlap); sd-colocated (drafter and verifier share all devices, as standard speculative
decoding runs); psd. At concurrency C, ar and both sd modes hold the C requests as one
batch, psd as two batches of C/2 (one batch of 1 at C = 1, where it has no overlap ceiling).
Writes one JSON with every number and PNG plots.

This file is the run loop and the flags. The rest of the harness: workload.py (prompts),
driver.py (drives requests and times them), report.py (the numbers of a run and of psd
against sd), table.py (how the numbers are shown), environment.py, plots.py, peers.py
(transformers), doc_regions.py (the docs' figures, regenerated from a bench.json).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import time
from pathlib import Path

from minedraft.bench.driver import run_workload
from minedraft.bench.environment import environment
from minedraft.bench.peers import peer_rows
from minedraft.bench.plots import plot_timeline, plot_vs_concurrency, plot_vs_k
from minedraft.bench.report import psd_against_sd, request_metrics, step_metrics
from minedraft.bench.table import terminal_table
from minedraft.bench.workload import load_prompts
from minedraft.client import Client
from minedraft.constants import BENCH_MODES, DATA_PLANES, DTYPES
from minedraft.launcher import Cluster, ServeConfig
from minedraft.service.placement import parse_cpus


def serve_config(mode: str, k: int, concurrency: int, args: argparse.Namespace) -> ServeConfig:
    base = dict(k=k, port=0, data_plane=args.data_plane, target=args.target, draft=args.draft,
                synthetic_acceptance=args.synthetic_acceptance, random_weights=args.random_weights,
                dtype=args.dtype, target_device=args.target_device, draft_device=args.draft_device,
                num_blocks=args.num_blocks)
    if mode == "psd":
        return ServeConfig(mode="psd", max_batch=max(1, concurrency // 2), **base)
    if mode == "sd-colocated":
        cpus = args.all_cpus
        threads = max(1, len(parse_cpus(cpus)))
        return ServeConfig(mode="sd", max_batch=concurrency, target_cpus=cpus, draft_cpus=cpus,
                           target_threads=threads, draft_threads=threads, **base)
    return ServeConfig(mode=mode, max_batch=concurrency, **base)


def measure(address: str, mode: str, k: int, concurrency: int, prompts: list[str],
            args: argparse.Namespace) -> dict:
    """Drive the workload through a running gateway and collect its step records."""
    label = f"{mode} k={k} C={concurrency}"
    with Client(address, timeout=600) as client:
        client.generate(prompts[0], max_tokens=4)                          # warm-up
        skip = len(client.step_stats())
    timings, wall = asyncio.run(run_workload(
        address, prompts, args.max_tokens, args.ignore_eos, concurrency, args.request_rate, label))
    with Client(address, timeout=600) as client:
        steps = client.step_stats()[skip:]
    row = {"mode": mode, "k": k, "concurrency": concurrency, **request_metrics(timings, wall),
           **step_metrics(steps)}
    return {"row": row, "steps": steps, "token_ids": [t.token_ids for t in timings]}


def run_one(mode: str, k: int, concurrency: int, prompts: list[str], args: argparse.Namespace) -> dict:
    with Cluster(serve_config(mode, k, concurrency, args)) as cluster:
        return measure(cluster.address, mode, k, concurrency, prompts, args)


def run_unequal(k: int, concurrency: int, prompts: list[str], args: argparse.Namespace) -> dict:
    """psd holding 2C requests (two batches of C) against sd's C: flatters psd whenever
    batching is cheap, so it is printed only on request and labelled."""
    config = dataclasses.replace(serve_config("psd", k, concurrency, args), max_batch=concurrency)
    with Cluster(config) as cluster:
        result = measure(cluster.address, "psd-2xC", k, 2 * concurrency, prompts, args)
    result["row"]["label"] = f"UNEQUAL: psd holds {2 * concurrency} requests, sd {concurrency}"
    return result


def measure_all(concurrency: int, prompts: list[str], args: argparse.Namespace) -> dict:
    """(mode, k) -> measured run, for every mode and k asked for (or the one --server runs)."""
    runs = {}
    if args.server:
        with Client(args.server, timeout=60) as client:
            info = client.server_info()
        runs[(info["mode"], info["k"])] = measure(args.server, info["mode"], info["k"], concurrency,
                                                  prompts, args)
    for mode in ([] if args.server else args.modes):
        for k in ([0] if mode == "ar" else args.k):
            runs[(mode, k)] = run_one(mode, k, concurrency, prompts, args)
    if args.unequal and "psd" in args.modes and not args.server:
        more = load_prompts(args.dataset, 2 * (args.num_prompts or 2 * concurrency))
        for k in args.k:
            runs[("psd-2xC", k)] = run_unequal(k, concurrency, more, args)
    return runs


def compare(runs: dict, concurrency: int, args: argparse.Namespace) -> None:
    """Fill in what each row says against the others: same output as ar, psd against sd."""
    reference = runs[("ar", 0)]["token_ids"] if ("ar", 0) in runs else None
    for (mode, k), result in runs.items():
        row = result["row"]
        # Synthetic acceptance changes outputs by design: there is nothing to compare.
        row["same_as_ar"] = (None if args.synthetic_acceptance is not None or mode == "psd-2xC"
                             else reference is None or result["token_ids"] == reference)
        if mode == "psd" and ("sd", k) in runs:
            sd = runs[("sd", k)]
            row.update(psd_against_sd(row, result["steps"], sd["row"], sd["steps"], concurrency))


def run(args: argparse.Namespace) -> int:
    if args.quick:
        args.modes, args.k, args.concurrency = list(BENCH_MODES), [4, 6], [8]
        args.num_prompts = args.num_prompts or 16
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"config": {k: v for k, v in vars(args).items() if k != "func"}, "environment": environment(),
              "runs": []}
    rows = []
    started = time.perf_counter()
    for concurrency in args.concurrency:
        prompts = load_prompts(args.dataset, args.num_prompts or 2 * concurrency)
        runs = measure_all(concurrency, prompts, args)
        compare(runs, concurrency, args)
        measured = [result["row"] for result in runs.values()]
        report["runs"] += [{**result["row"], "step_records": result["steps"]} for result in runs.values()]
        if args.peers:
            peers = peer_rows(args, prompts, concurrency)
            measured += peers
            report["runs"] += peers
        rows += measured
        print(terminal_table(measured, concurrency))
        psd_runs = [r for (m, _), r in runs.items() if m == "psd"]
        if psd_runs:
            best = max(psd_runs, key=lambda r: r["row"]["output_tokens_per_s"])
            plot_timeline(best["steps"], f"psd k={best['row']['k']} C={concurrency}", out)
    plot_vs_k(rows, out)
    plot_vs_concurrency(rows, out)
    report["elapsed_s"] = time.perf_counter() - started
    (out / "bench.json").write_text(json.dumps(report, indent=1, default=float))
    print(f"\nwrote {out / 'bench.json'} and plots in {out} ({report['elapsed_s']:.0f} s)")
    return 0 if all(r["same_as_ar"] is not False for r in rows) else 1


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    from minedraft import bundled

    bench = sub.add_parser("bench", help="benchmark ar, sd, sd-colocated and psd side by side")
    bench.add_argument("--modes", nargs="+", default=list(BENCH_MODES), choices=BENCH_MODES)
    bench.add_argument("--k", type=int, nargs="+", default=[2, 4, 6])
    bench.add_argument("--concurrency", type=int, nargs="+", default=[8])
    bench.add_argument("--num-prompts", type=int, default=0, help="default: 2 x concurrency")
    bench.add_argument("--max-tokens", type=int, default=64)
    bench.add_argument("--natural-stop", dest="ignore_eos", action="store_false",
                       help="stop at EOS instead of generating exactly --max-tokens")
    bench.add_argument("--request-rate", type=float, default=None,
                       help="open loop: Poisson arrivals per second (default: closed loop)")
    bench.add_argument("--dataset", default=None, help="ShareGPT .json, Spec-Bench question.jsonl or JSONL")
    bench.add_argument("--data-plane", default="gloo", choices=DATA_PLANES)
    bench.add_argument("--all-cpus", default="0-1", help="cores shared by sd-colocated")
    bench.add_argument("--target", default=bundled.TARGET)
    bench.add_argument("--draft", default=bundled.DRAFT)
    bench.add_argument("--synthetic-acceptance", type=float, default=None,
                       help="benchmark mode: the verifier accepts each draft with this probability "
                            "whatever the models say (outputs are then not the target's)")
    bench.add_argument("--random-weights", action="store_true",
                       help="read only config.json of --target/--draft and draw random weights (timing only)")
    bench.add_argument("--dtype", default="float32", choices=DTYPES)
    bench.add_argument("--target-device", default="cpu")
    bench.add_argument("--draft-device", default="cpu")
    bench.add_argument("--num-blocks", type=int, default=4096, help="KV cache blocks per service")
    bench.add_argument("--server", default=None,
                       help="measure an already running gateway (its own mode and k) instead of starting services")
    bench.add_argument("--unequal", action="store_true",
                       help="also run psd holding 2C requests (labelled: not an equal-concurrency comparison)")
    bench.add_argument("--peers", action="store_true",
                       help="also run transformers generate (batch C) and assisted generation (batch 1)")
    bench.add_argument("--out", default="bench_out")
    bench.add_argument("--quick", action="store_true",
                       help="C=8, k in {4, 6}, all modes: a little over a minute on 2 CPU cores")
    bench.set_defaults(func=run, ignore_eos=True)
    return bench
