"""The machine's pace: how fast this host does a fixed piece of work right now.

These hosts are shared. A loop of fixed matrix products on an otherwise idle machine ran at
330 to 570 iterations a second over 40 seconds, in spells of several seconds, with no steal
time recorded, and the median verify call of psd at C = 8 took 20 ms in one run and 49 ms
in a run of the same setting minutes later. A run made in a slow spell then reads as a slow
setting.

The bench probes the pace just before and just after each measured run, while the services
are idle (and around transformers' own runs), and the tables show each run's pace against
the other runs' at its concurrency, so that such a run can be told apart from a slow
setting. In a sweep of 50 settings run in two rounds, 36 saw the pace move by more than 5%
between their rounds, and the throughput moved the same way in 33 of them. The figures stay
as measured: a probe beside a run is not a measurement during it (scaled by it, one run
probed at 0.41 of the usual pace moved a headline ratio by two thirds).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

PROBE_S = 0.25          # each probe's length: a few hundred products
SIZE = 384              # the products' side (float32), on every core as the services use them


def probe(seconds: float = PROBE_S) -> float:
    """SIZE x SIZE float32 matrix products per second on all the cores, over `seconds` of
    wall time (a slow spell of the host shows in it whatever its cause: CPU taken by others,
    memory bandwidth, clock)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 1)
    try:
        a = torch.rand(SIZE, SIZE)
        b = torch.rand(SIZE, SIZE)
        torch.mm(a, b)                                  # the first product allocates
        done, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds:
            torch.mm(a, b)
            done += 1
        return done / elapsed
    finally:
        torch.set_num_threads(threads)


def probed(measure: Callable[[], T], seconds: float = PROBE_S) -> tuple[T, dict]:
    """`measure()` between two probes -> its result and the row's pace figures: the probes'
    mean, and each."""
    before = probe(seconds)
    result = measure()
    after = probe(seconds)
    return result, {"pace": (before + after) / 2, "pace_before": before, "pace_after": after}


def relative_paces(rows: list[dict]) -> None:
    """Each row's pace (the mean of its probes) over the median of the rows': 1.00 a run made
    at the usual pace, 0.80 one made while the host ran 20% slow. In place; rows without a
    probe (a report from before probes) are left alone."""
    paces = [row["pace"] for row in rows if row.get("pace")]
    if not paces:
        return
    usual = statistics.median(paces)
    for row in rows:
        if row.get("pace"):
            row["relative_pace"] = row["pace"] / usual
