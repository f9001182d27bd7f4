"""`minedraft bench --paired N`: every setting's services up at once, N short runs of each,
alternating, so that a ratio between two settings comes from runs made seconds apart.

A run of the usual kind starts its setting's services, warms them up and probes the host's
pace: a quarter of a minute for a measured run of a few seconds, so rounds are few. On the
reference machine (2 cores) the same setting's throughput swings 10-20% from one run to the
next, within one set of processes as much as between them (fixed `ar` at C = 4: 461-567 tok/s
over four runs in one process); with five rounds, auto against fixed `ar` at C = 4 read 0.88
(0.84-1.02) in one sweep while twelve runs of each, alternated, read 1.00. Here the services
start and warm up once, and the measured runs go A, B, ..., B, A, A, B, ...: each pass runs
every setting once, the next in the opposite order, so a slow drift weighs on every setting
alike, and a pass costs only its runs.

Reported per concurrency: each setting's throughput and p50 latency (median, spread), whether
its outputs equalled ar's, and auto's ratio to each fixed setting, to each pass's best fixed
setting and to the best fixed setting over the passes, paired within passes (median and
interquartile range). Where settings run level, each pass's best is the luckiest of several
noisy runs, a few percent above any one setting (so auto's ratio to it reads low): the report
says by how much each pass's best stood above the best setting's run. With --paired-control,
also a second ar's ratio to the first, which is not among the fixed settings auto is set
against: what identical settings read apart in the same passes (on the reference machine, eight
passes each: 0.983 at C = 16, 1.004 at C = 64, where auto read 0.934), against which a ratio
near 1 can be told real or not. paired.png draws the ratios against concurrency. The
settings that are not running idle meanwhile: a few wake-ups a second each (liveness checks,
the data plane's loop), so keep the list short (auto and the fixed settings it is compared
with).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from contextlib import ExitStack
from pathlib import Path

from minedraft.bench.driver import run_workload, warm_up
from minedraft.bench.main import settled_newest_step, steps_after, wait_for_quiet, workload_for
from minedraft.bench.plots import plot_paired
from minedraft.bench.report import auto_metrics, layout_changes, newest_decision, percentile, plain, request_metrics
from minedraft.bench.runs import PEERS, UNEQUAL, RunSpec, run_list, serve_config
from minedraft.client import Client
from minedraft.launcher import Cluster

AUTO = "auto"
CONTROL = "ar (control)"    # a second ar (--paired-control): what identical settings read apart


def refusal(args: argparse.Namespace) -> str | None:
    """What --paired cannot run with, or None."""
    if args.paired_control and not args.paired:
        return "--paired-control: only with --paired N"
    if args.paired_control and "ar" not in args.modes:
        return "--paired-control: a second ar needs ar among --modes"
    if args.paired < 2:
        return "--paired: at least 2 passes (a ratio needs pairs)"
    if args.server or args.peers or args.unequal:
        return "--paired runs the services it starts: not with --server, --peers or --unequal"
    if args.rounds != 1:
        return "--paired makes its own passes: leave --rounds at 1"
    if args.rate_steps or args.request_rate is not None:
        return "--paired compares closed-loop runs: not with --rate-steps or --request-rate"
    return None


def run_paired(args: argparse.Namespace) -> int:
    """-> 0, or 1 where an output differed from ar's."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"config": {key: v for key, v in vars(args).items() if key != "func"}, "concurrency": []}
    same, plotted = True, None
    for concurrency in args.concurrency:
        specs = [s for s in run_list(args) if s.concurrency == concurrency and s.mode not in (PEERS, UNEQUAL)]
        runs = measure_pairs(specs, concurrency, args)
        summary = summarise(runs)
        report["concurrency"].append({"concurrency": concurrency, "runs": runs, **summary})
        print(paired_table(concurrency, summary, args.paired))
        same = same and all(s["same_as_ar"] is not False for s in summary["settings"].values())
        part = out / "paired.json.part"
        part.write_text(json.dumps(report, indent=1, default=float))
        part.replace(out / "paired.json")
        plotted = plot_paired(report["concurrency"], out)
    print(f"\nwrote {out / 'paired.json'}" + (f" and {plotted}" if plotted else ""))
    return 0 if same else 1


def measure_pairs(specs: list[RunSpec], concurrency: int, args: argparse.Namespace) -> dict[str, list[dict]]:
    """Start every setting, warm each up, then args.paired passes. -> setting -> its runs in
    pass order: {pass, started_s, tokens_per_s, latency_p50_s, same_as_ar, and auto's
    layout_share and lent_share (report.auto_metrics)}."""
    workload = workload_for(concurrency, args)
    names = [setting_name(spec) for spec in specs]
    if args.paired_control:
        specs, names = [*specs, RunSpec("ar", 0, concurrency)], [*names, CONTROL]
    runs: dict[str, list[dict]] = {name: [] for name in names}
    with ExitStack() as stack:
        addresses = {}
        # Auto's last: its start-up profile measures the services, and the next setting's
        # model loading beside it would be measured too (the memory-bound stand-in's profile,
        # taken while other settings loaded their targets, priced a verify token at three times
        # its cost, and auto never drafted). Fixed settings measure nothing at start-up.
        for spec, name in sorted(zip(specs, names), key=lambda pair: pair[1] == AUTO):
            print(f"[paired C={concurrency}] starting {name}", flush=True)
            cluster = stack.enter_context(Cluster(serve_config(spec.mode, spec.k, concurrency, args)))
            addresses[name] = cluster.address
        addresses = {name: addresses[name] for name in names}       # (passes in the settings' order)
        for name, address in addresses.items():
            with Client(address, timeout=600) as client:
                client.generate(workload.prompts[0], max_tokens=4)
            if args.warmup_s > 0:
                asyncio.run(warm_up(address, workload.prompts, args.max_tokens, args.ignore_eos, concurrency,
                                    args.warmup_s, sampling=workload.sampling))
            with Client(address, timeout=600) as client:
                wait_for_quiet(client)              # (the warm-up's last steps; each run waits for its own)
        began = time.perf_counter()
        for index in range(args.paired):
            order = names if index % 2 == 0 else names[::-1]
            for name in order:
                with Client(addresses[name], timeout=600) as client:
                    before = settled_newest_step(client)
                    seen = newest_decision(plain(client.server_info()))
                started_s = time.perf_counter() - began
                timings, wall = asyncio.run(run_workload(addresses[name], workload.prompts, args.max_tokens,
                                                         args.ignore_eos, concurrency, None,
                                                         f"{name} C={concurrency}", sampling=workload.sampling))
                with Client(addresses[name], timeout=600) as client:
                    wait_for_quiet(client)
                    steps = steps_after(client, before)
                    info = plain(client.server_info())
                metrics = request_metrics(timings, wall)
                planned = {"layout_changes": layout_changes(info, seen, steps),
                           "layout_slowdown": info["plan"].get("layout_slowdown", {})} if info.get("plan") else {}
                runs[name].append({
                    "pass": index, "started_s": started_s, "tokens_per_s": metrics["output_tokens_per_s"],
                    "latency_p50_s": metrics["latency_p50_s"],
                    **auto_metrics(steps), **planned, "token_ids": [t.token_ids for t in timings]})
            done = ", ".join(f"{n} {runs[n][-1]['tokens_per_s']:.0f}" for n in names)
            print(f"[paired C={concurrency}] pass {index + 1}/{args.paired}: {done} tok/s", flush=True)
    greedy = args.synthetic_acceptance is None and not any(workload.sampling or [])
    reference = runs.get("ar", [{}])[0].get("token_ids") if greedy else None
    for name in names:
        for run in runs[name]:
            ids = run.pop("token_ids")
            run["same_as_ar"] = None if reference is None else ids == reference
    return runs


def setting_name(spec: RunSpec) -> str:
    return spec.mode if spec.mode in ("ar", AUTO) or spec.mode.startswith("ar-") else f"{spec.mode} k={spec.k}"


def _spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "p25": percentile(values, 25),
            "p75": percentile(values, 75), "min": min(values), "max": max(values)}


def _paired(top: list[dict], bottom: list[dict], key: str = "tokens_per_s") -> dict:
    """The spread of top's `key` over bottom's, pass by pass (the two lists in pass order)."""
    return _spread([t[key] / b[key] for t, b in zip(top, bottom, strict=True)])


def summarise(runs: dict[str, list[dict]]) -> dict:
    """Per setting: throughput and p50 latency (median and spread) and whether every output
    equalled ar's; auto against each fixed setting and against each pass's best fixed one,
    as ratios paired within passes. A pass's best fixed setting is its fastest, and auto's
    p50 is set against that setting's p50 in the same pass. The best fixed setting over the
    passes is the one of highest median throughput. The control (a second ar) is set
    against the first ar only."""
    settings = {name: {"tokens_per_s": _spread([r["tokens_per_s"] for r in rs]),
                       "latency_p50_s": _spread([r["latency_p50_s"] for r in rs]),
                       "same_as_ar": (None if any(r["same_as_ar"] is None for r in rs)
                                      else all(r["same_as_ar"] for r in rs))}
                for name, rs in runs.items()}
    summary: dict = {"settings": settings}
    if CONTROL in runs and "ar" in runs:
        summary["control_over_ar"] = _paired(runs[CONTROL], runs["ar"])
    fixed = [name for name in runs if name not in (AUTO, CONTROL)]
    if AUTO not in runs or not fixed:
        return summary
    summary["auto_over"] = {name: _paired(runs[AUTO], runs[name]) for name in fixed}
    best = [max(fixed, key=lambda name: runs[name][i]["tokens_per_s"]) for i in range(len(runs[AUTO]))]
    best_runs = [runs[name][i] for i, name in enumerate(best)]
    summary["auto_over_best_fixed"] = _paired(runs[AUTO], best_runs)
    summary["auto_p50_over_best_fixed"] = _paired(runs[AUTO], best_runs, "latency_p50_s")
    summary["best_fixed_per_pass"] = best
    # Each pass's best is the fastest of several settings' noisy runs, so where they run level
    # it stands above any one of them: set against the best setting over the passes too, and
    # how far each pass's best stood above that setting's run in the same pass.
    top = max(fixed, key=lambda name: statistics.median(r["tokens_per_s"] for r in runs[name]))
    summary["best_fixed"] = top
    summary["auto_over_best_setting"] = _paired(runs[AUTO], runs[top])
    summary["pass_best_over_best_setting"] = _paired(best_runs, runs[top])
    shares = [r.get("layout_share", {}) for r in runs[AUTO]]
    summary["auto_layout_share"] = {layout: statistics.mean(share.get(layout, 0.0) for share in shares)
                                    for layout in sorted({layout for share in shares for layout in share})}
    lent = [r["lent_share"] for r in runs[AUTO] if "lent_share" in r]
    if lent:
        summary["auto_lent_share"] = statistics.mean(lent)
    return summary


def paired_table(concurrency: int, summary: dict, passes: int) -> str:
    lines = [f"\n== concurrency {concurrency}: {passes} passes, every setting once a pass, alternating order ==",
             f"{'setting':<12} {'tok/s':>8} {'(min-max)':>15} {'p50 s':>7} {'==ar':>5} {'auto / it (IQR)':>22}"]
    over = summary.get("auto_over", {})
    for name, s in summary["settings"].items():
        t, ratio = s["tokens_per_s"], over.get(name)
        shown = f"{ratio['median']:.3f} ({ratio['p25']:.2f}-{ratio['p75']:.2f})" if ratio else ""
        same = {None: "n/a", True: "yes", False: "NO"}[s["same_as_ar"]]
        span = f"({t['min']:.0f}-{t['max']:.0f})"
        lines.append(f"{name:<12} {t['median']:>8.1f} {span:>15} "
                     f"{s['latency_p50_s']['median']:>7.3f} {same:>5} {shown:>22}")
    if "control_over_ar" in summary:
        c = summary["control_over_ar"]
        lines.append(f"{CONTROL} / ar: {c['median']:.3f} (IQR {c['p25']:.2f}-{c['p75']:.2f}, "
                     f"{c['min']:.2f}-{c['max']:.2f}): what two identical settings read apart here")
    if "auto_over_best_fixed" in summary:
        b, p = summary["auto_over_best_fixed"], summary["auto_p50_over_best_fixed"]
        lines.append(f"auto / each pass's best fixed setting: throughput {b['median']:.3f} "
                     f"(IQR {b['p25']:.2f}-{b['p75']:.2f}), p50 latency {p['median']:.3f} "
                     f"(IQR {p['p25']:.2f}-{p['p75']:.2f})")
        t, lift = summary["auto_over_best_setting"], summary["pass_best_over_best_setting"]
        lines.append(f"auto / the best fixed setting over the passes ({summary['best_fixed']}): {t['median']:.3f} "
                     f"(IQR {t['p25']:.2f}-{t['p75']:.2f}); each pass's best stood {lift['median']:.3f} "
                     f"(IQR {lift['p25']:.2f}-{lift['p75']:.2f}) over it in the same pass")
        layouts = ", ".join(f"{layout} {share:.0%}" for layout, share in summary["auto_layout_share"].items())
        lent = f"; plain steps on the lent cores {summary['auto_lent_share']:.0%}" if "auto_lent_share" in summary else ""
        lines.append(f"auto's steps: {layouts or 'none recorded'}{lent}")
    return "\n".join(lines)
