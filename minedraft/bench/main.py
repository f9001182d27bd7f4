"""`minedraft bench`: every mode on the same prompts, hardware and concurrency, in one run.

Modes: auto (the gateway picks the layout and each request's draft length at every step,
from a cost model it measures; k is the longest draft it may choose); ar, the verifier on
every core the other modes use; sd (drafter on its own device: same devices as psd, no
overlap); sd-colocated (drafter and verifier share all devices, as standard speculative
decoding runs); psd; and, on request only, ar-1core (the verifier on one core, labelled).
At concurrency C, ar and both sd modes hold the C requests as one batch, psd as two batches
of C/2 (one batch of 1 at C = 1, where it has no overlap ceiling), auto C in the layout it
picks. The headline is auto against the best fixed setting and transformers' generate
(headline.py). Writes one JSON with every number and PNG plots.

A run sends --num-prompts prompts, by default max(16, 4C). --rounds N makes every run at a
concurrency N times, interleaved (each round in another order, each mode's runs spread over
it: runs.round_order), and reports each figure as the median of its rounds with the
throughput's spread, and the headline's ratios paired within each round (rounds.py,
headline.py): a run of a few seconds on a noisy machine swings 10-25%, and one round says
little about a gain of a few percent.

This file is the run loop and the flags. The rest of the harness: runs.py (presets, the
list of runs and their order in each round), rounds.py (rounds folded into medians),
workload.py (prompts), driver.py (drives requests and times them), phases.py (a rate that
steps), report.py (the numbers of a run), headline.py (what auto is measured against),
table.py (how the numbers are shown), environment.py, plots.py, peers.py (transformers),
doc_regions.py (the docs' figures, regenerated from a bench.json).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import time
from pathlib import Path

from minedraft.bench.driver import poisson_times, run_workload, warm_up
from minedraft.bench.environment import environment
from minedraft.bench.headline import ONE_CORE_AR, headline
from minedraft.bench.pace import probed, relative_paces
from minedraft.bench.peers import peer_rows
from minedraft.bench.phases import (format_rate_steps, parse_rate_steps, phase_metrics, poisson_arrivals,
                                    throughput_series)
from minedraft.bench.plots import plot_auto, plot_rate_steps, plot_timeline, plot_vs_concurrency, plot_vs_k
from minedraft.bench.report import (acceptance_by_kind, auto_metrics, model_error, newest_decision, plain,
                                    psd_against_sd, request_metrics, step_metrics)
from minedraft.bench.rounds import fold_rows, fold_runs
from minedraft.bench.runs import (PEERS, SERVER, UNEQUAL, Progress, RunSpec, apply_presets, num_prompts, round_order,
                                  run_list, serve_config)
from minedraft.bench.table import terminal_table
from minedraft.bench.workload import DATASETS, Workload, load_workload
from minedraft.client import Client
from minedraft.constants import BENCH_MODES, DATA_PLANES, DTYPES
from minedraft.extras import require
from minedraft.launcher import Cluster, ServeConfig


def arrivals_for(count: int, args: argparse.Namespace) -> list[float] | None:
    """Each request's arrival time in an open loop; None for the closed loop."""
    if args.rate_steps:
        return poisson_arrivals(args.rate_steps)
    return None if args.request_rate is None else poisson_times(count, args.request_rate)


def workload_for(concurrency: int, args: argparse.Namespace, scale: int = 1) -> Workload:
    """The prompts of a run: as many as the --rate-steps schedule sends, else --num-prompts
    (default max(16, 4C)), `scale` times over."""
    count = len(poisson_arrivals(args.rate_steps)) if args.rate_steps else num_prompts(concurrency, args)
    return load_workload(args.dataset, scale * count)


def wait_for_quiet(client: Client, quiet_s: float = 0.05, limit_s: float = 5.0) -> None:
    """Until no step record arrives for quiet_s, or twice the newest step's wall time where
    that is longer (or limit_s has passed): a step pipelined past the end of the last request
    (plain decoding keeps two in flight) runs after its request has finished. Polled with the
    newest record alone, not all of them."""
    last, give_up = client.step_stats(max_steps=1), time.monotonic() + limit_s
    while time.monotonic() < give_up:
        time.sleep(max([quiet_s, *(2 * step.get("wall_s", 0.0) for step in last)]))
        now = client.step_stats(max_steps=1)
        if now == last:
            break
        last = now


def settled_newest_step(client: Client, quiet_s: float = 0.05, limit_s: float = 5.0) -> int:
    """The newest step's id once no more records arrive (-1: none yet): a run's records are
    those after it (`steps_after`), and the steps pipelined past the warm-up are not."""
    wait_for_quiet(client, quiet_s, limit_s)
    return max((step["step_id"] for step in client.step_stats(max_steps=1)), default=-1)


def steps_after(client: Client, step_id: int) -> list[dict]:
    """The gateway's step records of the steps after `step_id`: picked by id, not by count,
    so that the gateway's ring of records may have wrapped meanwhile."""
    return [step for step in plain(client.step_stats()) if step["step_id"] > step_id]


def measure(address: str, mode: str, k: int, concurrency: int, workload: Workload, args: argparse.Namespace,
            config: ServeConfig | None = None) -> dict:
    """Drive the workload through a running gateway and collect its step records."""
    label = f"{mode} k={k} C={concurrency}"
    with Client(address, timeout=600) as client:
        client.generate(workload.prompts[0], max_tokens=4)                          # warm-up
    if args.warmup_s > 0:
        asyncio.run(warm_up(address, workload.prompts, args.max_tokens, args.ignore_eos, concurrency,
                            args.warmup_s, sampling=workload.sampling))
    with Client(address, timeout=600) as client:
        before = settled_newest_step(client)
        # auto's decisions so far (the warm-up's) are not the run's
        seen = newest_decision(plain(client.server_info()))
    arrivals = arrivals_for(len(workload.prompts), args)
    if arrivals is not None:            # a schedule sends as many prompts as it has arrivals
        workload = workload.head(len(arrivals))

    def run_then_quiet():
        result = asyncio.run(run_workload(address, workload.prompts, args.max_tokens, args.ignore_eos,
                                          concurrency, arrivals, label, sampling=workload.sampling))
        with Client(address, timeout=600) as client:
            wait_for_quiet(client)
        return result

    # Probed while the services idle: the host's pace, not theirs. Not before the steps
    # pipelined past the last request have run: a two-thread verifier step beside the probe's
    # two threads slowed it up to twenty-fold (in the da97ac6 sweep the probes after ar's and
    # auto's runs read 0.05-0.65 of the usual, as if those runs had been made in slow spells).
    (timings, wall), pace = probed(run_then_quiet)
    with Client(address, timeout=600) as client:
        steps = steps_after(client, before)
        info = plain(client.server_info())
    row = {"mode": mode, "k": k, "concurrency": concurrency,
           # Whose cores: None where a running gateway's placement is unknown (--server).
           "verifier_cpus": config and config.target_cpus, "verifier_threads": config and config.target_threads,
           "drafter_cpus": config and (config.draft_cpus if config.mode != "ar" else ""),
           **pace,
           **request_metrics(timings, wall), **step_metrics(steps), **model_error(steps), **auto_metrics(steps)}
    by_kind = acceptance_by_kind(timings, workload.kinds)
    if by_kind:
        row["acceptance_by_kind"] = by_kind
    if args.rate_steps:
        row["phases"] = phase_metrics(timings, args.rate_steps)
        row["tokens_per_s_series"] = throughput_series(timings)
        # Where the schedule's clock starts on the gateway's (the first request's first step).
        row["schedule_start_s"] = min((c["start_s"] for c in steps), default=0.0) - min(t.start_s for t in timings)
    if info.get("cost_model", {}).get("draft_calls") or info.get("cost_model", {}).get("verify_calls"):
        row["cost_model"] = info["cost_model"]
    history = []
    if info.get("mode") == "auto":
        row["plan"] = info.get("plan", {})
        # The run's decisions, on the steps' clock; kept beside the steps (round 1's are drawn).
        history = [d for d in row["plan"].pop("history", []) if d["at_s"] > seen]
    return {"row": row, "steps": steps, "token_ids": [t.token_ids for t in timings], "history": history}


def run_one(spec: RunSpec, workload: Workload, args: argparse.Namespace) -> dict:
    config = serve_config(spec.mode, spec.k, spec.concurrency, args)
    with Cluster(config) as cluster:
        return measure(cluster.address, spec.mode, spec.k, spec.concurrency, workload, args, config)


def run_unequal(k: int, concurrency: int, workload: Workload, args: argparse.Namespace) -> dict:
    """psd holding 2C requests (two batches of C) against sd's C: flatters psd whenever
    batching is cheap, so it is printed only on request and labelled."""
    config = dataclasses.replace(serve_config("psd", k, concurrency, args), max_batch=concurrency)
    with Cluster(config) as cluster:
        result = measure(cluster.address, UNEQUAL, k, 2 * concurrency, workload, args, config)
    result["row"]["label"] = f"UNEQUAL: psd holds {2 * concurrency} requests, sd {concurrency}"
    return result


def run_server(concurrency: int, workload: Workload, args: argparse.Namespace) -> tuple[tuple[str, int], dict]:
    """--server: the running gateway in its own mode and k; -> ((mode, k), measured run)."""
    with Client(args.server, timeout=60) as client:
        info = client.server_info()
    return (info["mode"], info["k"]), measure(args.server, info["mode"], info["k"], concurrency, workload, args)


def differences(reference: list[list[int]], outputs: list[list[int]], shown: int = 3) -> list[dict]:
    """Where each output leaves ar's: the prompt's index, the first differing position and a
    few tokens of each from there, so a near-tie (the target's top two logits all but equal,
    tests/reference.py) can be told from a fault after the run."""
    found = []
    for index, (expected, got) in enumerate(zip(reference, outputs)):
        if got != expected:
            first = next((j for j, (a, b) in enumerate(zip(expected, got)) if a != b), min(len(expected), len(got)))
            found.append({"prompt": index, "token": first, "ar": expected[first:first + shown],
                          "got": got[first:first + shown]})
    return found


def compare(runs: dict, concurrency: int, args: argparse.Namespace) -> None:
    """Fill in what each row says against the others: same output as ar, psd against sd at
    the same k (the overlap's own figures)."""
    reference = next((runs[key]["token_ids"] for key in (("ar", 0), (ONE_CORE_AR, 0)) if key in runs), None)
    for (mode, k), result in runs.items():
        row = result["row"]
        # Synthetic acceptance changes outputs by design: there is nothing to compare.
        row["same_as_ar"] = (None if args.synthetic_acceptance is not None or mode == UNEQUAL
                             else reference is None or result["token_ids"] == reference)
        if row["same_as_ar"] is False:
            row["differences"] = differences(reference, result["token_ids"])
        if mode == "psd" and ("sd", k) in runs:
            sd = runs[("sd", k)]
            row.update(psd_against_sd(row, result["steps"], sd["row"], sd["steps"], concurrency))


def measure_round(specs: list[RunSpec], concurrency: int, args: argparse.Namespace, progress: Progress,
                  index: int) -> tuple[dict, list[dict]]:
    """One round of the runs at one concurrency, in `specs`' order -> ((mode, k) -> measured
    run, transformers' rows), each compared with the same round's ar."""
    workload = workload_for(concurrency, args)
    runs, peers = {}, []
    for spec in specs:
        progress.begin(spec, index)
        if spec.mode == PEERS:
            peers = peer_rows(args, workload.prompts, concurrency)
        elif spec.mode == SERVER:
            key, result = run_server(concurrency, workload, args)
            runs[key] = result
        elif spec.mode == UNEQUAL:
            runs[(UNEQUAL, spec.k)] = run_unequal(spec.k, concurrency, workload_for(concurrency, args, 2), args)
        else:
            runs[(spec.mode, spec.k)] = run_one(spec, workload, args)
        progress.end()
    compare(runs, concurrency, args)
    return runs, peers


def measure_concurrency(specs: list[RunSpec], concurrency: int, args: argparse.Namespace,
                        progress: Progress) -> tuple[dict, list[dict]]:
    """Every run at one concurrency, --rounds times interleaved -> ((mode, k) -> measured run,
    transformers' rows), one per (mode, k) with the medians of its rounds, in `specs`' order."""
    rounds = [measure_round(round_order(specs, index, args.rounds), concurrency, args, progress, index)
              for index in range(args.rounds)]
    return (fold_runs([runs for runs, _ in rounds], [(spec.mode, spec.k) for spec in specs]),
            fold_rows([peers for _, peers in rounds]))


def plot_runs(runs: dict, concurrency: int, args: argparse.Namespace, out: Path) -> None:
    """The timeline of psd's best k, and what auto chose over time (with the rate, if it stepped)."""
    psd_runs = [r for (m, _), r in runs.items() if m == "psd"]
    if psd_runs:
        best = max(psd_runs, key=lambda r: r["row"]["output_tokens_per_s"])
        plot_timeline(best["steps"], f"psd k={best['row']['k']} C={concurrency}", out)
    for (mode, k), result in runs.items():
        if mode == "auto":
            plot_auto(result["steps"], f"auto k={k} C={concurrency}", out, args.rate_steps,
                      result["row"].get("schedule_start_s"), result["history"])


def missing_extra(specs: list[RunSpec]) -> str | None:
    """What the run needs and this install lacks, said before minutes of measuring, not after."""
    try:
        require("matplotlib", "bench", "minedraft bench's plots")
        if any(spec.mode == PEERS for spec in specs):
            require("transformers", "peers", "minedraft bench --peers")
    except ModuleNotFoundError as err:
        return str(err)
    return None


def run(args: argparse.Namespace) -> int:
    from minedraft.bench.paired import refusal, run_paired

    problem = apply_presets(args) or (refusal(args) if args.paired or args.paired_control else None) \
        or missing_extra(run_list(args))
    if problem:
        print(f"minedraft bench: error: {problem}", file=sys.stderr)
        return 2
    if args.paired:
        return run_paired(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    config = {key: v for key, v in vars(args).items() if key != "func"}
    if args.rate_steps:
        config["rate_steps"] = format_rate_steps(args.rate_steps)
    report = {"config": config, "environment": environment(), "runs": []}
    rows = []
    specs = run_list(args)
    progress = Progress(len(specs) * args.rounds, args.rounds)
    for concurrency in args.concurrency:
        runs, peers = measure_concurrency([s for s in specs if s.concurrency == concurrency], concurrency,
                                          args, progress)
        measured = [result["row"] for result in runs.values()] + peers
        relative_paces(measured)
        top = headline(measured)
        if top is not None and top.subject["mode"] == "auto":
            top.subject.update(top.figures())
        report["runs"] += [{**result["row"], "step_records": result["steps"],
                            **({"plan_history": result["history"]} if result["history"] else {})}
                           for result in runs.values()] + peers
        rows += measured
        print(terminal_table(measured, concurrency))
        plot_runs(runs, concurrency, args, out)
        # What is measured so far, in case the sweep is stopped (the plots across
        # concurrencies come at the end).
        _write_report({**report, "partial": True, "elapsed_s": progress.elapsed_s()}, out)
    plot_vs_k(rows, out)
    plot_vs_concurrency(rows, out)
    if args.rate_steps:
        plot_rate_steps(rows, args.rate_steps, out)
    report["elapsed_s"] = progress.elapsed_s()
    _write_report(report, out)
    print(f"\nwrote {out / 'bench.json'} and plots in {out} ({report['elapsed_s']:.0f} s)")
    return 0 if all(r["same_as_ar"] is not False for r in rows) else 1


def _write_report(report: dict, out: Path) -> None:
    """bench.json, replaced whole (a reader never sees half a file)."""
    part = out / "bench.json.part"
    part.write_text(json.dumps(report, indent=1, default=float))
    part.replace(out / "bench.json")


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    from minedraft import bundled

    bench = sub.add_parser("bench", help="benchmark auto, ar, sd, sd-colocated and psd side by side")
    bench.add_argument("--modes", nargs="+", default=list(BENCH_MODES), choices=(*BENCH_MODES, ONE_CORE_AR),
                       help=f"default: {' '.join(BENCH_MODES)}; {ONE_CORE_AR}: ar with the verifier on one core")
    bench.add_argument("--k", type=int, nargs="+", default=[2, 4, 6])
    bench.add_argument("--psd-k", type=int, nargs="+", default=None, help="psd's draft lengths (default: --k)")
    bench.add_argument("--auto-k", type=int, default=None,
                       help="the longest draft auto may choose (default: the largest --k or --psd-k)")
    bench.add_argument("--concurrency", type=int, nargs="+", default=[8])
    bench.add_argument("--num-prompts", type=int, default=0,
                       help="prompts per run (default: max(16, 4 x concurrency): every request slot "
                            "refilled three times, so most of a run is steady serving)")
    bench.add_argument("--rounds", type=int, default=1,
                       help="make every run at a concurrency N times, interleaved (each round in another "
                            "order); report each figure's median, the throughput's spread, and the "
                            "headline's ratios paired within rounds (median and range)")
    bench.add_argument("--paired", type=int, default=0, metavar="N",
                       help="start every setting's services at once and alternate N short runs of each "
                            "(each pass in the opposite order): ratios paired within passes, many passes "
                            "cheap; auto against each fixed setting and each pass's best (paired.json)")
    bench.add_argument("--paired-control", action="store_true",
                       help="with --paired: also a second ar, run like every other setting; its ratio to "
                            "the first is what two identical settings read apart here, the resolution of "
                            "the other ratios")
    bench.add_argument("--warmup-s", type=float, default=5.0,
                       help="before each measured run, serve the run's prompts at its concurrency for this "
                            "long, unmeasured, as a running server has (auto mode's costs and acceptance "
                            "learned, caches warm); 0 measures from a cold start")
    bench.add_argument("--max-tokens", type=int, default=64)
    bench.add_argument("--natural-stop", dest="ignore_eos", action="store_false",
                       help="stop at EOS instead of generating exactly --max-tokens")
    bench.add_argument("--request-rate", type=float, default=None,
                       help="open loop: Poisson arrivals per second (default: closed loop)")
    bench.add_argument("--rate-steps", type=parse_rate_steps, default=None, metavar="RATE:SECONDS,...",
                       help='open loop whose Poisson rate steps, e.g. "2:20,8:20,2:20" (requests/s : seconds); '
                            "as many prompts as arrive; throughput is also reported per phase")
    bench.add_argument("--dataset", default=None,
                       help=f"ShareGPT .json, Spec-Bench question.jsonl or JSONL (a row may set its own temperature/"
                            f"top_p/top_k/seed), or a shipped set: {', '.join(DATASETS)} (greedy code completion and "
                            f"sampled prose, seeded, alternating: two kinds of clients with different acceptance, "
                            f"reported per kind)")
    bench.add_argument("--data-plane", default="unix", choices=DATA_PLANES)
    bench.add_argument("--all-cpus", default="0-1", help="cores of ar's verifier, of sd-colocated and of transformers")
    bench.add_argument("--target", default=bundled.TARGET)
    bench.add_argument("--draft", default=bundled.DRAFT)
    bench.add_argument("--synthetic-acceptance", type=float, nargs="+", default=None,
                       help="benchmark mode: the verifier accepts each draft with this probability "
                            "whatever the models say (outputs are then not the target's); several: new "
                            "requests take them in turn, e.g. 0.9 0.1 for requests that draft well and badly")
    bench.add_argument("--random-weights", action="store_true",
                       help="read only config.json of --target/--draft and draw random weights (timing only)")
    bench.add_argument("--memory-bound", action="store_true",
                       help="a random-weight 256M target that does not fit in the CPU cache and a small draft "
                            "(shipped configs), --synthetic-acceptance 0.7 unless given: a GPU-like stand-in")
    bench.add_argument("--dtype", default="float32", choices=DTYPES)
    bench.add_argument("--target-device", default="cpu")
    bench.add_argument("--draft-device", default="cpu")
    bench.add_argument("--num-blocks", type=int, default=None,
                       help="KV cache blocks per service (default: room for the run's concurrency of the "
                            "dataset's longest prompt, --max-tokens and a draft, a quarter more)")
    bench.add_argument("--server", default=None,
                       help="measure an already running gateway (its own mode and k) instead of starting services")
    bench.add_argument("--unequal", action="store_true",
                       help="also run psd holding 2C requests (labelled: not an equal-concurrency comparison)")
    bench.add_argument("--peers", action="store_true",
                       help="also run transformers generate (batch C) and assisted generation (batch 1)")
    bench.add_argument("--out", default="bench_out")
    bench.add_argument("--quick", action="store_true",
                       help="C=8, k in {4, 6}, all default modes: a minute or two on 2 CPU cores")
    bench.add_argument("--sweep", action="store_true",
                       help="C in 1..64 (powers of 2), all default modes, k in {2, 4, 6} (psd also 8): hours; "
                            "add --rounds N (N times as long) for medians a ratio can be stated from")
    bench.set_defaults(func=run, ignore_eos=True)
    return bench
