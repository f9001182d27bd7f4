"""The Batch Manager's plain types: its configuration, a batch as it pipelines it, and one
request's place in a verify step."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from gateway.request import ActiveRequest
from minedraft.constants import MODES
from minedraft.v1 import engine_pb2


@dataclass(frozen=True)
class DraftedItem:
    """One request of a verify step: its draft length and whose drafts they are."""

    request: ActiveRequest
    num_draft: int
    source: int = 0     # index into the step's DraftSource list (when num_draft > 0)
    # The tokens its step is expected to give (1 + its drafts' reach, as auto chose k by);
    # None: not estimated (its tokens stand for themselves).
    expected_tokens: float | None = None


@dataclass
class Batch:
    index: int
    requests: list[ActiveRequest] = field(default_factory=list)
    drafted: list[DraftedItem] | None = None      # drafted, awaiting verification
    sources: list[engine_pb2.DraftSource] = field(default_factory=list)
    has_work: asyncio.Event = field(default_factory=asyncio.Event)

    def to_draft(self) -> list[ActiveRequest]:
        return [r for r in self.requests if r.live]

    def in_flight(self, req: ActiveRequest) -> bool:
        return self.drafted is not None and any(item.request is req for item in self.drafted)


@dataclass(frozen=True)
class BatchManagerConfig:
    mode: str
    k: int
    max_batch: int              # requests per batch (m); in auto mode, running at once
    kv_blocks: int              # the verifier's KV cache, in blocks (each drafter's is its own)
    block_size: int
    step_timeout_s: float = 30.0    # the least deadline of a service call (see Deadlines)
    max_waiting: int = 1024         # requests queued beyond the batches; more are refused
    auto_cycle_steps: int = 0       # tests only: auto mode rotates layouts every this many steps
    early_verify: bool = True       # send a step's verify with its drafts' call (see BatchManager)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.k < 0 or (self.mode != "ar" and self.k < 1):
            raise ValueError(f"k must be >= 1 for mode {self.mode!r}, got {self.k}")
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {self.max_batch}")
        if not self.step_timeout_s > 0:
            raise ValueError(f"step_timeout_s must be > 0, got {self.step_timeout_s}")
        if self.auto_cycle_steps < 0 or (self.auto_cycle_steps and self.mode != "auto"):
            raise ValueError(f"auto_cycle_steps must be >= 0 and only in auto mode, got {self.auto_cycle_steps}")
        if self.max_waiting < 0:
            raise ValueError(f"max_waiting must be >= 0, got {self.max_waiting}")


class Overloaded(Exception):
    """The admission queue is full (RESOURCE_EXHAUSTED)."""
