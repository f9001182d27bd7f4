"""A load that changes within one run (`--rate-steps "2:20,8:20,2:20"`): an open loop whose
Poisson arrival rate steps through phases, and the run's figures per phase, so a mode that
adapts (auto) can be seen following the load up and back down."""

from __future__ import annotations

import argparse
import random
import statistics
from dataclasses import dataclass

from minedraft.bench.driver import RequestTiming


@dataclass(frozen=True)
class Phase:
    rate: float          # requests per second
    duration_s: float


def parse_rate_steps(text: str) -> list[Phase]:
    """"2:20,8:20" -> [Phase(2, 20), Phase(8, 20)]; an argparse type, so bad input is a usage error."""
    phases = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            rate, duration = (float(x) for x in part.split(":"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected RATE:SECONDS pairs, got {part!r}") from None
        if rate <= 0 or duration <= 0:
            raise argparse.ArgumentTypeError(f"rate and seconds must be positive, got {part!r}")
        phases.append(Phase(rate, duration))
    if not phases:
        raise argparse.ArgumentTypeError("expected at least one RATE:SECONDS pair")
    return phases


def format_rate_steps(phases: list[Phase]) -> str:
    return ",".join(f"{p.rate:g}:{p.duration_s:g}" for p in phases)


def phase_bounds(phases: list[Phase]) -> list[tuple[float, float]]:
    """Each phase's [start, end) in seconds from the run's start."""
    bounds, start = [], 0.0
    for phase in phases:
        bounds.append((start, start + phase.duration_s))
        start += phase.duration_s
    return bounds


def poisson_arrivals(phases: list[Phase], seed: int = 0) -> list[float]:
    """Arrival times (s from the run's start) of a Poisson process whose rate is each phase's
    within its window. Memorylessness lets each window draw afresh from its own start."""
    rng = random.Random(seed)
    arrivals = []
    for phase, (start, end) in zip(phases, phase_bounds(phases)):
        t = start + rng.expovariate(phase.rate)
        while t < end:
            arrivals.append(t)
            t += rng.expovariate(phase.rate)
    return arrivals


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def phase_metrics(timings: list[RequestTiming], phases: list[Phase]) -> list[dict]:
    """Per phase: tokens emitted within its window over its length (what the service kept up
    with), and the latency of the requests that arrived in it (queueing included: timings
    start at arrival). Tokens emitted after the last window (the drain) count in no phase."""
    rows = []
    for phase, (start, end) in zip(phases, phase_bounds(phases)):
        arrived = [t for t in timings if start <= t.start_s < end]
        tokens = sum(start <= s < end for t in timings for s in t.token_s)
        rows.append({"rate": phase.rate, "start_s": start, "end_s": end, "requests": len(arrived),
                     "output_tokens_per_s": tokens / phase.duration_s,
                     "latency_p50_s": _median([t.end_s - t.start_s for t in arrived]),
                     "ttft_p50_s": _median([t.ttft_s for t in arrived])})
    return rows


def throughput_series(timings: list[RequestTiming], bin_s: float = 1.0) -> list[float]:
    """Output tokens/s in consecutive bins of `bin_s` from the run's start (for plots)."""
    times = [s for t in timings for s in t.token_s]
    if not times:
        return []
    counts = [0] * (int(max(times) // bin_s) + 1)
    for s in times:
        counts[int(s // bin_s)] += 1
    return [c / bin_s for c in counts]
