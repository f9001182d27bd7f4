"""Where the two services' time goes, defined once from the gateway's call records: the
gateway's Prometheus metrics add each record as it is made, `minedraft bench` adds a run's
records afterwards, and both read the same figures off the same `Timeline`.

A call's record (StepRecord) says when the gateway sent it (start_s), how long until the
answer (wall_s), and what the service reports of its own time. A service answers the moment
its work ends, so a call's work is the stretch just before its answer reached the gateway:
  drafter busy  [end - draft_busy_s, end]
  verifier busy [end - verify_busy_s - data_plane_s, end]: its wait for the drafts on the
                data plane, then its compute [end - verify_busy_s, end]
(The answer's own trip back is counted as work by this, so the gateway share below is, if
anything, too small by one loopback message per call.)

Figures, over the active span (the stretch from a call's sending to its answer, with the
gaps between calls shorter than IDLE_GAP_S counted in: the gateway's own turn-around; a
longer gap is the server idle, counted nowhere):
  drafter / verifier busy share  sum of its busy seconds / span; idle share = 1 - busy share
  data_plane_share               sum of data_plane_s / span
  overlap_share                  seconds the drafter computes while the verifier computes / span
  gateway_share                  seconds neither service computes nor takes drafts off the
                                 data plane / span: the gateway's work and the control
                                 messages' transport
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

IDLE_GAP_S = 1.0          # a longer stretch with no call in flight is idle time, not the gateway's
KEPT_INTERVALS = 4096     # disjoint stretches a live union remembers (records arrive in end order)

Interval = tuple[float, float]


def call_end(call: Mapping[str, Any]) -> float:
    return call.get("start_s", 0.0) + call["wall_s"]


def drafter_interval(call: Mapping[str, Any]) -> Interval | None:
    busy = call.get("draft_busy_s", 0.0)
    end = call_end(call)
    return (end - busy, end) if busy else None


def verifier_interval(call: Mapping[str, Any], with_data_plane: bool = True) -> Interval | None:
    busy = call.get("verify_busy_s", 0.0) + (call.get("data_plane_s", 0.0) if with_data_plane else 0.0)
    end = call_end(call)
    return (end - busy, end) if busy else None


def busy_intervals(calls: list[Mapping[str, Any]]) -> tuple[list[Interval], list[Interval]]:
    """Each call's busy interval on the gateway's clock -> (drafter's, verifier's incl. data plane)."""
    drafter = [i for i in map(drafter_interval, calls) if i is not None]
    verifier = [i for i in map(verifier_interval, calls) if i is not None]
    return drafter, verifier


class IntervalUnion:
    """The length of a union of intervals, grown one interval at a time. Intervals arrive
    roughly in order of their ends; the oldest disjoint stretches beyond `kept` are
    forgotten (None: none), so a live gateway's memory stays bounded."""

    def __init__(self, kept: int | None = KEPT_INTERVALS) -> None:
        self.kept = kept
        self.length = 0.0
        self._stretches: list[Interval] = []      # disjoint, sorted

    def add(self, start: float, end: float, bridge_s: float = 0.0) -> float:
        """Add [start, end]; a gap of at most bridge_s to a neighbouring stretch is filled in.
        -> how much the union grew (never negative)."""
        if end <= start:
            return 0.0
        stretches = self._stretches
        right = len(stretches)
        while right and stretches[right - 1][0] > end + bridge_s:
            right -= 1
        left, merged_start, merged_end, removed = right, start, end, 0.0
        while left and stretches[left - 1][1] >= start - bridge_s:
            s, e = stretches[left - 1]
            merged_start, merged_end, removed = min(merged_start, s), max(merged_end, e), removed + e - s
            left -= 1
        stretches[left:right] = [(merged_start, merged_end)]
        if self.kept is not None and len(stretches) > self.kept:
            del stretches[:len(stretches) - self.kept]
        grown = merged_end - merged_start - removed
        self.length += grown
        return grown


class Timeline:
    """Running totals of the figures above; `add` one call record at a time."""

    def __init__(self, kept: int | None = KEPT_INTERVALS) -> None:
        self.drafter_busy_s = 0.0
        self.verifier_busy_s = 0.0
        self.data_plane_s = 0.0
        self.data_plane_bytes = 0
        self._span = IntervalUnion(kept)
        self._drafter = IntervalUnion(kept)
        self._verifier_compute = IntervalUnion(kept)
        self._drafter_or_compute = IntervalUnion(kept)     # for the overlap: |D| + |V| - |D u V|
        self._any_service = IntervalUnion(kept)            # drafter or verifier (data plane included)

    @classmethod
    def of(cls, calls: list[Mapping[str, Any]]) -> "Timeline":
        """A finished run's records, added in the order their answers came."""
        timeline = cls(kept=None)
        for call in sorted(calls, key=call_end):
            timeline.add(call)
        return timeline

    def add(self, call: Mapping[str, Any]) -> None:
        self.drafter_busy_s += call.get("draft_busy_s", 0.0)
        self.verifier_busy_s += call.get("verify_busy_s", 0.0)
        self.data_plane_s += call.get("data_plane_s", 0.0)
        self.data_plane_bytes += call.get("data_plane_bytes", 0)
        self._span.add(call.get("start_s", 0.0), call_end(call), bridge_s=IDLE_GAP_S)
        drafter, compute, verifier = (drafter_interval(call), verifier_interval(call, with_data_plane=False),
                                      verifier_interval(call))
        if drafter is not None:
            self._drafter.add(*drafter)
            self._drafter_or_compute.add(*drafter)
            self._any_service.add(*drafter)
        if compute is not None:
            self._verifier_compute.add(*compute)
            self._drafter_or_compute.add(*compute)
        if verifier is not None:
            self._any_service.add(*verifier)

    @property
    def span_s(self) -> float:
        return self._span.length

    @property
    def overlap_s(self) -> float:
        """Seconds the drafter computed while the verifier computed (never decreases)."""
        return max(0.0, self._drafter.length + self._verifier_compute.length - self._drafter_or_compute.length)

    @property
    def any_service_busy_s(self) -> float:
        """Seconds in which the drafter or the verifier works (data plane included)."""
        return self._any_service.length

    @property
    def gateway_s(self) -> float:
        return max(0.0, self.span_s - self.any_service_busy_s)

    def shares(self) -> dict[str, float]:
        """The run's shares of its active span (nan before any call)."""
        span = self.span_s
        if span <= 0:
            return dict.fromkeys(SHARES, math.nan)
        return {"drafter_busy_share": self.drafter_busy_s / span, "verifier_busy_share": self.verifier_busy_s / span,
                "drafter_idle_share": 1 - self.drafter_busy_s / span,
                "verifier_idle_share": 1 - self.verifier_busy_s / span,
                "data_plane_share": self.data_plane_s / span, "overlap_share": self.overlap_s / span,
                "gateway_share": self.gateway_s / span}


SHARES = ("drafter_busy_share", "verifier_busy_share", "drafter_idle_share", "verifier_idle_share",
          "data_plane_share", "overlap_share", "gateway_share")
