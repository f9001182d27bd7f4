"""`minedraft demo`: the bundled pair served in every mode, side by side.

Starts the services (verifier and drafter on their own cores), streams one completion,
then runs a handful of concurrent requests per mode (auto, the default of `minedraft serve`,
last, with the layout it settled on) and prints tokens/s and mean acceptance length. With --in-process it uses the library directly instead of services.
It ends with a curl line and an `openai` snippet to try against `minedraft serve`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from minedraft import bundled
from minedraft.constants import DEFAULT_GATEWAY, HTTP_PORT
from minedraft.launcher.examples import curl_example, openai_example
from minedraft.metrics import AcceptanceStats
from minedraft.tables import text_table


def run(args: argparse.Namespace) -> int:
    prompts = bundled.load_prompts(args.num_prompts)
    print(f"bundled pair, {len(prompts)} held-out prompts x {args.max_tokens} tokens, "
          f"concurrency {args.concurrency}, k={args.k}"
          + (f"; each mode serves them for {args.warmup_s:g} s before it is timed"
             if args.warmup_s > 0 and not args.in_process else "")
          + "\n")
    rows = _in_process(args, prompts) if args.in_process else _services(args, prompts)
    reference = rows[0][3]
    table = [("mode", "tokens/s", "mean acc. len", "greedy output == ar")]
    for mode, tps, mal, outputs in rows:
        same = "reference" if mode == "ar" else ("yes" if outputs == reference else "NO")
        table.append((mode, f"{tps:.1f}", f"{mal:.2f}", same))
    print("\n" + "\n".join(text_table(table)))
    _print_try_it()
    return 0 if all(r[3] == reference for r in rows) else 1


def _print_try_it() -> None:
    """The services above have stopped: what to run to keep one serving and call its
    OpenAI-compatible API."""
    url, model = f"http://127.0.0.1:{HTTP_PORT}", Path(bundled.TARGET).name
    print(f"\nTo keep the pair serving, run `minedraft serve` (gRPC on {DEFAULT_GATEWAY}, OpenAI-compatible "
          f"HTTP on {url}/v1); then, from another terminal:\n")
    print(f"    {curl_example(url, model)}\n")
    print("    # or from Python (pip install openai):")
    print("\n".join(f"    {line}" if line else "" for line in openai_example(url, model).splitlines()))


def _services(args, prompts):
    from minedraft.client import Client, SamplingOptions
    from minedraft.launcher import Cluster, ServeConfig

    options = SamplingOptions(max_tokens=args.max_tokens, ignore_eos=True)
    rows = []
    for mode in ("ar", "sd", "psd", "auto"):
        m = args.concurrency // 2 if mode == "psd" else args.concurrency
        cores = os.cpu_count() or 1
        # Plain decoding gets every core the other modes use between their two services.
        placement = dict(target_cpus=f"0-{cores - 1}", target_threads=cores) if mode == "ar" and cores > 1 else {}
        cluster = Cluster(ServeConfig(mode=mode, k=args.k, max_batch=max(1, m), port=0, **placement))
        print(f"starting {mode} services ...", flush=True)
        with cluster, Client(cluster.address, timeout=600) as client:
            if mode == "psd":
                print("streamed psd completion:\n" + "-" * 40)
                print(prompts[0], end="")
                for chunk in client.stream(prompts[0], options):
                    print(chunk.text, end="", flush=True)
                print("\n" + "-" * 40)
            with ThreadPoolExecutor(args.concurrency) as pool:
                # A fresh server's first second holds one-off costs in every mode (threads and
                # buffers made; in auto also its start-up profile and a first trial of each
                # layout, which put auto at 0.6 of ar's pace when the 1 s timed round came
                # first): the demo compares how the modes serve, as the bench does after its
                # warm-up.
                warm_until = time.perf_counter() + args.warmup_s
                while time.perf_counter() < warm_until:
                    list(pool.map(lambda p: client.generate(p, options), prompts))
                start = time.perf_counter()
                results = list(pool.map(lambda p: client.generate(p, options), prompts))
                elapsed = time.perf_counter() - start
            if mode == "auto":
                plan = client.server_info()["plan"]
                print(f"auto settled on {plan['layout']}, draft lengths {sorted(set(plan['draft_lengths']))} "
                      f"after {plan['layout_switches']} layout switches")
        tokens = sum(len(r.token_ids) for r in results)
        mal = _mean_acceptance_length(mode, [r.stats.to_stats() for r in results])
        rows.append((mode, tokens / elapsed, mal, [r.token_ids for r in results]))
    return rows


def _in_process(args, prompts):
    import torch

    from minedraft.llm import LLM
    from minedraft.sampling_params import SamplingParams

    torch.set_num_threads(1)
    llm = LLM(bundled.TARGET, bundled.DRAFT)
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
    rows = []
    for mode in ("ar", "sd"):
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, mode=mode, k=args.k, max_batch=args.concurrency)
        elapsed = time.perf_counter() - start
        if mode == "ar":
            print("ar completion:\n" + prompts[0] + outputs[0].text + "\n")
        rows.append((mode, sum(len(o.token_ids) for o in outputs) / elapsed,
                     _mean_acceptance_length(mode, [o.stats for o in outputs]),
                     [o.token_ids for o in outputs]))
    return rows


def _mean_acceptance_length(mode: str, per_request: list[AcceptanceStats]) -> float:
    """Over all requests, by the one definition (minedraft.metrics); plain decoding scores 1.0."""
    total = AcceptanceStats()
    for stats in per_request:
        total.merge(stats)
    return total.mean_acceptance_length if mode != "ar" and total.num_steps else 1.0


def add_parser(sub) -> None:
    demo = sub.add_parser("demo", help="serve the bundled pair in every mode and compare")
    demo.add_argument("--num-prompts", type=int, default=16, help="held-out prompts sent in each mode")
    demo.add_argument("--max-tokens", type=int, default=64, help="tokens generated per prompt")
    demo.add_argument("--concurrency", type=int, default=8, help="requests in flight at once")
    demo.add_argument("--k", type=int, default=4, help="draft length (auto: the longest draft)")
    demo.add_argument("--warmup-s", type=float, default=5.0,
                      help="seconds each mode serves the prompts, untimed, before the timed round")
    demo.add_argument("--in-process", action="store_true", help="use the library in this process")
    demo.set_defaults(func=run)


if __name__ == "__main__":
    sys.exit(run(argparse.Namespace(num_prompts=16, max_tokens=64, concurrency=8, k=4, warmup_s=5.0,
                                    in_process=False)))
