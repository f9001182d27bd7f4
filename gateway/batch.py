"""A batch as the Batch Manager pipelines it, and one request's place in a verify step."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from gateway.request import ActiveRequest
from minedraft.v1 import engine_pb2


@dataclass(frozen=True)
class DraftedItem:
    """One request of a verify step: its draft length and whose drafts they are."""

    request: ActiveRequest
    num_draft: int
    source: int = 0     # index into the step's DraftSource list (when num_draft > 0)


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
