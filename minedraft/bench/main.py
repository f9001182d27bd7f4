"""`minedraft bench`: every mode on the same prompts, hardware and concurrency, in one run.

Modes: ar; sd (drafter on its own device: the fair baseline, same devices as psd, no
overlap); sd-colocated (drafter and verifier share all devices, as standard speculative
decoding runs); psd. At concurrency C, ar and both sd modes hold the C requests as one
batch, psd as two batches of C/2. Writes one JSON with every number and PNG plots.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import platform
import subprocess
import time
from pathlib import Path

from minedraft.bench.driver import run_workload
from minedraft.bench.plots import plot_timeline, plot_vs_concurrency, plot_vs_k
from minedraft.bench.report import overlap_ceiling, request_metrics, step_metrics
from minedraft.bench.workload import load_prompts
from minedraft.client import Client
from minedraft.constants import BENCH_MODES, DATA_PLANES, DTYPES
from minedraft.launcher import Cluster, ServeConfig
from minedraft.service.placement import parse_cpus

MIN_CEILING_GAIN = 0.05   # overlap efficiency is reported where the ceiling is above 1.05


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


def measure(address: str, mode: str, k: int, concurrency: int, prompts: list[str], args) -> dict:
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


def run_one(mode: str, k: int, concurrency: int, prompts: list[str], args) -> dict:
    with Cluster(serve_config(mode, k, concurrency, args)) as cluster:
        return measure(cluster.address, mode, k, concurrency, prompts, args)


def run_unequal(k: int, concurrency: int, prompts: list[str], args) -> dict:
    """psd holding 2C requests (two batches of C) against sd's C: flatters psd whenever
    batching is cheap, so it is printed only on request and labelled."""
    config = dataclasses.replace(serve_config("psd", k, concurrency, args), max_batch=concurrency)
    with Cluster(config) as cluster:
        result = measure(cluster.address, "psd-2xC", k, 2 * concurrency, prompts, args)
    result["row"]["label"] = f"UNEQUAL: psd holds {2 * concurrency} requests, sd {concurrency}"
    return result


def peer_rows(args, prompts: list[str], concurrency: int) -> list[dict]:
    """transformers in this process on all cores: batched generate at batch C, and assisted
    generation (speculative, batch 1 only) on the same prompts and output length."""
    import os

    import torch

    from minedraft.bench.peers import load_peer, transformers_generate

    torch.set_num_threads(os.cpu_count() or 1)
    tokenizer, model, assistant = load_peer(args.target, args.draft)
    rows = []
    for mode, batch, helper in [("hf-generate", concurrency, None), ("hf-assisted", 1, assistant)]:
        tps = transformers_generate(tokenizer, model, prompts, args.max_tokens, batch, helper)
        rows.append({"mode": mode, "k": 0, "concurrency": concurrency if helper is None else 1,
                     "output_tokens_per_s": tps, "peer_batch": batch, "same_as_ar": True})
    return rows


def environment() -> dict:
    import grpc
    import torch
    import transformers

    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).resolve().parent, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return {"commit": commit, "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "grpc": grpc.__version__,
            "machine": platform.machine(), "cpus": __import__("os").cpu_count()}


def print_table(rows: list[dict], concurrency: int) -> None:
    print(f"\n== concurrency {concurrency}: ar/sd hold {concurrency} requests as one batch, "
          f"psd as 2 x {concurrency // 2} ==")
    print(f"{'mode':<13}{'k':>3}{'tok/s':>8}{'req/s':>7}{'p50 s':>7}{'p99 s':>7}{'TTFT':>7}{'TPOT ms':>8}"
          f"{'MAL':>6}{'gw%':>6}{'dp%':>6}{'ceil':>6}{'psd/sd':>7}{'eff':>6}  ==ar")
    for r in rows:
        if r["mode"].startswith("hf-"):
            if r["concurrency"] == concurrency or r["peer_batch"] == 1:
                print(f"{r['mode']:<13}{'':>3}{r['output_tokens_per_s']:>8.1f}   (transformers, "
                      f"batch {r['peer_batch']}, all cores, same prompts and length)")
            continue
        if r["mode"] == "psd-2xC":
            if r["concurrency"] == 2 * concurrency:
                print(f"{r['mode']:<13}{r['k']:>3}{r['output_tokens_per_s']:>8.1f}   ({r['label']})")
            continue
        if r["concurrency"] != concurrency:
            continue
        extra = (f"{r['ceiling']:>6.2f}{r['psd_over_sd']:>7.2f}{r['overlap_efficiency']:>6.2f}"
                 if "ceiling" in r else " " * 19)
        print(f"{r['mode']:<13}{r['k']:>3}{r['output_tokens_per_s']:>8.1f}{r['requests_per_s']:>7.2f}"
              f"{r['latency_p50_s']:>7.2f}{r['latency_p99_s']:>7.2f}{r['ttft_p50_s']:>7.2f}"
              f"{r['tpot_mean_s'] * 1e3:>8.1f}{r['mean_acceptance_length']:>6.2f}"
              f"{r['gateway_share'] * 100:>6.1f}{r['data_plane_share'] * 100:>6.1f}{extra}  "
              f"{'n/a' if r['same_as_ar'] is None else 'yes' if r['same_as_ar'] else 'NO'}")


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
        reference = runs[("ar", 0)]["token_ids"] if ("ar", 0) in runs else None
        for (mode, k), result in runs.items():
            row = result["row"]
            # Synthetic acceptance changes outputs by design: there is nothing to compare.
            row["same_as_ar"] = (None if args.synthetic_acceptance is not None or mode == "psd-2xC"
                                 else reference is None or result["token_ids"] == reference)
            if mode == "psd" and ("sd", k) in runs:
                sd = runs[("sd", k)]
                row.update(overlap_ceiling(sd["steps"], result["steps"], concurrency))
                row["psd_over_sd"] = row["output_tokens_per_s"] / sd["row"]["output_tokens_per_s"]
                row["of_ceiling"] = row["psd_over_sd"] / row["ceiling"]
                # A gain over a gain: meaningless when the ceiling promises (almost) none.
                row["overlap_efficiency"] = ((row["psd_over_sd"] - 1) / (row["ceiling"] - 1)
                                             if row["ceiling"] > 1 + MIN_CEILING_GAIN else float("nan"))
            rows.append(row)
            report["runs"].append({**row, "step_records": result["steps"]})
        if args.peers:
            rows += peer_rows(args, prompts, concurrency)
            report["runs"] += [r for r in rows if r["concurrency"] == concurrency and r["mode"].startswith("hf-")]
        print_table(rows, concurrency)
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


def add_parser(sub) -> None:
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
    bench.add_argument("--quick", action="store_true", help="C=8, k in {4, 6}, all modes: a few minutes")
    bench.set_defaults(func=run, ignore_eos=True)
