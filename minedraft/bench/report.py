"""Numbers of one benchmark run, from client timings and the gateway's step records (shares
of the run, auto's choices, the cost model's accuracy), and the mechanism figures of psd
against sd at the same k (the overlap ceiling). Headline comparisons: headline.py."""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Any

import numpy as np

from minedraft.bench.driver import RequestTiming
from minedraft.metrics import AcceptanceStats
from minedraft.timeline import SHARES, Timeline, busy_intervals, verifier_interval

MIN_CEILING_GAIN = 0.05   # overlap efficiency is reported where the ceiling is above 1.05


def percentile(values: list[float], q: float) -> float:
    """numpy's percentile (linear between the two nearest ranks); nan for no values."""
    return float(np.percentile(values, q)) if values else float("nan")


def acceptance(timings: list[RequestTiming]) -> AcceptanceStats:
    """Every request's counts merged, so the run's figures follow minedraft.metrics' definition."""
    total = AcceptanceStats()
    for timing in timings:
        total.merge(timing.acceptance)
    return total


def plain(value: Any) -> Any:
    """A value from the client (protobuf messages, repeated and map fields included) as plain
    Python, so step records and server info can be stored as JSON."""
    if value is None or isinstance(value, (str, bytes, bool, int, float)):
        return value
    if hasattr(value, "DESCRIPTOR"):                      # a message
        return {f.name: plain(getattr(value, f.name)) for f in value.DESCRIPTOR.fields}
    if hasattr(value, "items"):                           # a dict or a map field
        return {key: plain(item) for key, item in value.items()}
    return [plain(item) for item in value]                # a list or a repeated field


def acceptance_by_kind(timings: list[RequestTiming], kinds: list[str]) -> dict[str, dict]:
    """The acceptance figures of each kind of prompt (code, prose, ...); empty when the
    prompts carry no kind or nothing was drafted. `kinds` is in prompt order, as the timings are."""
    if not any(kinds) or not any(t.acceptance.num_drafted for t in timings):
        return {}
    merged: dict[str, AcceptanceStats] = {}
    counts: Counter[str] = Counter()
    for timing, kind in zip(timings, kinds, strict=True):
        merged.setdefault(kind, AcceptanceStats()).merge(timing.acceptance)
        counts[kind] += 1
    return {kind: {"requests": counts[kind], "acceptance_rate": stats.acceptance_rate,
                   "mean_acceptance_length": stats.mean_acceptance_length if stats.num_steps else 1.0}
            for kind, stats in merged.items()}


def request_metrics(timings: list[RequestTiming], wall_s: float) -> dict:
    latency = [t.end_s - t.start_s for t in timings]
    ttft = [t.ttft_s for t in timings]
    tpot = [(t.end_s - t.start_s - t.ttft_s) / (t.output_tokens - 1) for t in timings if t.output_tokens > 1]
    tokens = sum(t.output_tokens for t in timings)
    stats = acceptance(timings)
    return {
        "requests": len(timings), "output_tokens": tokens, "wall_s": wall_s,
        "output_tokens_per_s": tokens / wall_s, "requests_per_s": len(timings) / wall_s,
        "latency_p50_s": percentile(latency, 50), "latency_p90_s": percentile(latency, 90),
        "latency_p99_s": percentile(latency, 99),
        "ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99),
        "tpot_mean_s": statistics.mean(tpot) if tpot else float("nan"),
        # The gateway records only steps that drafted, so plain decoding arrives with no
        # steps, where AcceptanceStats answers 0.0; it emitted one token a step: 1.0.
        "mean_acceptance_length": stats.mean_acceptance_length if stats.num_steps else 1.0,
        "acceptance_rate": stats.acceptance_rate,
        "acceptance_rate_per_position": stats.acceptance_rate_per_position,
    }


def _overlaps(interval: tuple[float, float], others: list[tuple[float, float]]) -> bool:
    return any(start < interval[1] and interval[0] < end for start, end in others)


def step_metrics(calls: list[dict]) -> dict:
    """Shares of the run's active span from the gateway's call records, as minedraft.timeline
    defines them (the gateway's Prometheus metrics read the same Timeline). A step is one
    verify call; it overlaps when a draft ran during its compute."""
    if not calls:
        nan = float("nan")
        return {"steps": 0, "overlap_steps": 0, "step_wall_mean_ms": nan, **dict.fromkeys(SHARES, nan),
                "data_plane_bytes_per_step": nan}
    timeline = Timeline.of(calls)
    drafter, _ = busy_intervals(calls)
    steps = [c for c in calls if c.get("kind") == "verify"]
    verify_compute = [i for i in (verifier_interval(c, with_data_plane=False) for c in steps) if i is not None]
    return {
        "steps": len(steps), "overlap_steps": sum(_overlaps(v, drafter) for v in verify_compute),
        "step_wall_mean_ms": timeline.span_s / max(1, len(steps)) * 1e3, **timeline.shares(),
        "data_plane_bytes_per_step": timeline.data_plane_bytes / max(1, len(steps)),
    }


def busy_at(steps: list[dict], batch: int) -> tuple[float, float]:
    """Median drafter time t and verifier time V of steps with exactly `batch` requests."""
    drafts = [s["draft_busy_s"] for s in steps if s.get("draft_batch") == batch and "draft_busy_s" in s]
    verifies = [s["verify_busy_s"] for s in steps if s.get("verify_batch") == batch and "verify_busy_s" in s]
    return (statistics.median(drafts) if drafts else float("nan"),
            statistics.median(verifies) if verifies else float("nan"))


def overlap_ceiling(sd_steps: list[dict], psd_steps: list[dict], concurrency: int) -> dict:
    """[t(C) + V(C)] / [2 max(t(C/2), V(C/2))]: psd's best gain over sd at equal concurrency.

    nan where psd has no half batch to time: at C = 1 it holds one batch of one request, and
    records with no batch count (unset fields read 0) must not pass for steps of size 0."""
    nan = float("nan")
    t_full, v_full = busy_at(sd_steps, concurrency)
    t_half, v_half = busy_at(psd_steps, concurrency // 2) if concurrency >= 2 else (nan, nan)
    half_step = max(t_half, v_half)
    return {"t_full_ms": t_full * 1e3, "v_full_ms": v_full * 1e3, "t_half_ms": t_half * 1e3,
            "v_half_ms": v_half * 1e3,
            "ceiling": (t_full + v_full) / (2 * half_step) if half_step > 0 else nan}


def psd_against_sd(psd_row: dict, psd_steps: list[dict], sd_row: dict, sd_steps: list[dict],
                   concurrency: int) -> dict:
    """psd's measured gain over sd at the same k beside the gain the overlap ceiling allows."""
    figures = overlap_ceiling(sd_steps, psd_steps, concurrency)
    ceiling = figures["ceiling"]
    psd_over_sd = psd_row["output_tokens_per_s"] / sd_row["output_tokens_per_s"]
    return {**figures, "psd_over_sd": psd_over_sd, "of_ceiling": psd_over_sd / ceiling if ceiling > 0 else float("nan"),
            # A gain over a gain: meaningless when the ceiling promises (almost) none.
            "overlap_efficiency": ((psd_over_sd - 1) / (ceiling - 1)
                                   if ceiling > 1 + MIN_CEILING_GAIN else float("nan"))}


def model_error(calls: list[dict]) -> dict:
    """The cost model's accuracy over the run: median |predicted - measured| / measured busy
    time per kind of call, from the records that carry a prediction (predicted_busy_s > 0).
    nan for a kind with none (ar drafts nothing; an older gateway predicts nothing)."""
    errors: dict[str, list[float]] = {"draft": [], "verify": []}
    for c in calls:
        kind, predicted = c.get("kind"), c.get("predicted_busy_s", 0.0)
        measured = c.get(f"{kind}_busy_s", 0.0)      # draft_busy_s or verify_busy_s
        if kind in errors and predicted > 0 and measured > 0:
            errors[kind].append(abs(predicted - measured) / measured)
    nan = float("nan")
    return {"model_error_draft": statistics.median(errors["draft"]) if errors["draft"] else nan,
            "model_error_verify": statistics.median(errors["verify"]) if errors["verify"] else nan,
            "model_predictions": len(errors["draft"]) + len(errors["verify"])}


def auto_steps(calls: list[dict]) -> list[tuple[float, str, list[int]]]:
    """(start_s, layout, draft lengths) of each step auto ran, in time order: its verify calls,
    which exist in every layout (draft lengths empty or 0 where it decoded plainly)."""
    steps = [c for c in calls if c.get("kind") == "verify" and c.get("layout")]
    return sorted((c.get("start_s", 0.0), c["layout"], list(c.get("draft_lengths", []))) for c in steps)


def auto_metrics(calls: list[dict]) -> dict:
    """What auto chose over the run: each layout's share of its steps and the draft lengths
    (mean over every request of every step, and the longest); {} for a run with no layouts."""
    steps = auto_steps(calls)
    if not steps:
        return {}
    layouts = Counter(layout for _, layout, _ in steps)
    lengths = [k for _, _, ks in steps for k in ks]
    metrics = {"layout_share": {layout: n / len(steps) for layout, n in layouts.most_common()},
               "mean_draft_length": statistics.mean(lengths) if lengths else 0.0,
               "max_draft_length": max(lengths, default=0)}
    plain = [c for c in calls if c.get("kind") == "verify" and c.get("layout") == "ar"]
    if plain:           # plain decoding on the drafter's cores too (on CPU, where it pays)
        metrics["lent_share"] = sum(1 for c in plain if c.get("borrowed")) / len(plain)
    return metrics


def newest_decision(info: dict) -> float:
    """When (on the steps' clock) auto's latest plan decision in GetServerInfo was made:
    decisions after it are a later run's."""
    return max((d["at_s"] for d in (info.get("plan") or {}).get("history", [])), default=float("-inf"))


def layout_changes(info: dict, seen: float, calls: list[dict]) -> list[dict]:
    """auto's decisions since `seen` that changed its layout, the first of them included:
    when (seconds from the run's first step), to which layout, whether as a trial, for how
    many requests and what the planner predicted each layout would give then. A paired run
    keeps them per pass, so a pass that ran a layout slower than plain decoding says why."""
    start = min((c["start_s"] for c in calls if "start_s" in c), default=0.0)
    changes, last = [], None
    for decision in (info.get("plan") or {}).get("history", []):
        if decision["at_s"] <= seen or decision["layout"] == last:
            continue
        last = decision["layout"]
        changes.append({"at_s": round(decision["at_s"] - start, 3), "layout": last,
                        "trying": bool(decision.get("trying")), "requests": decision.get("requests", 0),
                        "tokens_per_s": {k: round(v, 1) for k, v in decision.get("layout_tokens_per_s", {}).items()}})
    return changes
