"""Retrying a peer that is starting, restarting or busy: gRPC's own reconnect backoff for the
connection, and one backoff schedule for the calls we repeat ourselves.

A call made with `wait_for_ready=True` waits for its channel to connect instead of failing at
once, so a client never sleeps to find out whether a server is up yet; the channel options
below only make gRPC retry the connection sooner than its defaults (1 s, growing to 120 s),
which suit long-lived clients, not a peer that is seconds from serving.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

# Reconnect after 0.1 s, then 1.6 times longer each time (gRPC's multiplier), at most 5 s apart.
RECONNECT_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 5000)]


@dataclass(frozen=True)
class Backoff:
    """Exponential delays between attempts, from `initial_s` up to `max_s`, each lengthened by
    up to `jitter` of itself so that replicas restarted together do not retry in lockstep."""

    initial_s: float = 0.1
    max_s: float = 5.0
    factor: float = 2.0
    jitter: float = 0.25

    def __post_init__(self) -> None:
        if not 0 < self.initial_s <= self.max_s or self.factor < 1 or self.jitter < 0:
            raise ValueError(f"backoff needs 0 < initial_s <= max_s, factor >= 1 and jitter >= 0, got {self}")

    def delays(self) -> Iterator[float]:
        """An endless schedule of delays in seconds."""
        delay = self.initial_s
        while True:
            yield delay * (1 + random.uniform(0, self.jitter))
            delay = min(delay * self.factor, self.max_s)
