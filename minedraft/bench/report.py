"""Numbers of one benchmark run, from client timings and the gateway's step records."""

from __future__ import annotations

import statistics

from minedraft.bench.driver import RequestTiming


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def request_metrics(timings: list[RequestTiming], wall_s: float) -> dict:
    latency = [t.end_s - t.start_s for t in timings]
    ttft = [t.ttft_s for t in timings]
    tpot = [(t.end_s - t.start_s - t.ttft_s) / (t.output_tokens - 1) for t in timings if t.output_tokens > 1]
    steps = sum(t.num_steps for t in timings)
    drafted = sum(t.num_drafted for t in timings)
    accepted = sum(t.num_accepted for t in timings)
    tokens = sum(t.output_tokens for t in timings)
    positions = max((len(t.drafted_at) for t in timings), default=0)
    drafted_at = [sum(t.drafted_at[j] for t in timings if j < len(t.drafted_at)) for j in range(positions)]
    accepted_at = [sum(t.accepted_at[j] for t in timings if j < len(t.accepted_at)) for j in range(positions)]
    return {
        "requests": len(timings), "output_tokens": tokens, "wall_s": wall_s,
        "output_tokens_per_s": tokens / wall_s, "requests_per_s": len(timings) / wall_s,
        "latency_p50_s": percentile(latency, 50), "latency_p90_s": percentile(latency, 90),
        "latency_p99_s": percentile(latency, 99),
        "ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99),
        "tpot_mean_s": statistics.mean(tpot) if tpot else float("nan"),
        # Defined once (minedraft.metrics): bonus token included; plain decoding scores 1.0.
        "mean_acceptance_length": (accepted + steps) / steps if drafted and steps else 1.0,
        "acceptance_rate": accepted / drafted if drafted else 0.0,
        "acceptance_rate_per_position": [a / d if d else 0.0 for a, d in zip(accepted_at, drafted_at)],
    }


def step_metrics(steps: list[dict]) -> dict:
    """Per-step costs and shares of the run's step wall time."""
    wall = sum(s["wall_s"] for s in steps) or float("nan")
    draft = sum(s.get("draft_busy_s", 0.0) for s in steps)
    verify = sum(s.get("verify_busy_s", 0.0) for s in steps)
    data_plane = sum(s.get("data_plane_s", 0.0) for s in steps)
    own = sum(max(0.0, s["wall_s"] - max(s.get("draft_busy_s", 0.0),
                                         s.get("verify_busy_s", 0.0) + s.get("data_plane_s", 0.0)))
              for s in steps)
    return {
        "steps": len(steps), "overlap_steps": sum(s.get("kind") == "overlap" for s in steps),
        "step_wall_mean_ms": wall / len(steps) * 1e3 if steps else float("nan"),
        "drafter_busy_share": draft / wall, "verifier_busy_share": verify / wall,
        "drafter_idle_share": 1 - draft / wall, "verifier_idle_share": 1 - verify / wall,
        "data_plane_share": data_plane / wall, "gateway_share": own / wall,
        "data_plane_bytes_per_step": sum(s.get("data_plane_bytes", 0) for s in steps) / max(1, len(steps)),
    }


def busy_at(steps: list[dict], batch: int) -> tuple[float, float]:
    """Median drafter time t and verifier time V of steps with exactly `batch` requests."""
    drafts = [s["draft_busy_s"] for s in steps if s.get("draft_batch") == batch and "draft_busy_s" in s]
    verifies = [s["verify_busy_s"] for s in steps if s.get("verify_batch") == batch and "verify_busy_s" in s]
    return (statistics.median(drafts) if drafts else float("nan"),
            statistics.median(verifies) if verifies else float("nan"))


def overlap_ceiling(sd_steps: list[dict], psd_steps: list[dict], concurrency: int) -> dict:
    """[t(C) + V(C)] / [2 max(t(C/2), V(C/2))]: psd's best gain over sd at equal concurrency."""
    t_full, v_full = busy_at(sd_steps, concurrency)
    t_half, v_half = busy_at(psd_steps, concurrency // 2)
    return {"t_full_ms": t_full * 1e3, "v_full_ms": v_full * 1e3, "t_half_ms": t_half * 1e3,
            "v_half_ms": v_half * 1e3, "ceiling": (t_full + v_full) / (2 * max(t_half, v_half))}
