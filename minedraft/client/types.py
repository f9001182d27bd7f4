"""What the SDK hands back and sends: frozen dataclasses built from the wire messages.

Callers never touch protobuf messages; this is the one place that converts them.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import Message

from minedraft.constants import DEFAULT_GATEWAY
from minedraft.v1 import generation_pb2

DEFAULT_TARGET = DEFAULT_GATEWAY


class _Default(enum.Enum):
    """Sentinel for "use the client's timeout", since None already means "no deadline"."""

    TIMEOUT = enum.auto()


CLIENT_TIMEOUT = _Default.TIMEOUT
Timeout = float | None | _Default


# --------------------------------------------------------------------------- results

@dataclass(frozen=True)
class AcceptanceSummary:
    """Speculative-decoding acceptance for one request (mean length includes the bonus token)."""

    num_steps: int
    num_drafted: int
    num_accepted: int
    mean_acceptance_length: float
    acceptance_rate: float
    drafted_at: tuple[int, ...] = ()     # [j]: steps that drafted position j
    accepted_at: tuple[int, ...] = ()    # [j]: steps whose draft at position j was accepted

    @property
    def acceptance_rate_per_position(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accepted_at, self.drafted_at)]

    @classmethod
    def from_proto(cls, stats: generation_pb2.AcceptanceStats) -> AcceptanceSummary:
        return cls(num_steps=stats.num_steps, num_drafted=stats.num_drafted,
                   num_accepted=stats.num_accepted,
                   mean_acceptance_length=stats.mean_acceptance_length,
                   acceptance_rate=stats.acceptance_rate,
                   drafted_at=tuple(stats.drafted_at), accepted_at=tuple(stats.accepted_at))


@dataclass(frozen=True)
class GenerationResult:
    """A finished request."""

    request_id: str
    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" | "length" | "abort"
    prompt_tokens: int
    stats: AcceptanceSummary

    @classmethod
    def from_proto(cls, response: generation_pb2.GenerateResponse) -> GenerationResult:
        return cls(request_id=response.request_id, text=response.text,
                   token_ids=list(response.token_ids), finish_reason=response.finish_reason,
                   prompt_tokens=response.prompt_tokens,
                   stats=AcceptanceSummary.from_proto(response.stats))


@dataclass(frozen=True)
class StreamChunk:
    """New text and tokens since the previous chunk; the last one carries the outcome."""

    request_id: str
    text: str
    token_ids: list[int]
    finish_reason: str | None  # None until the last chunk
    stats: AcceptanceSummary | None  # set on the last chunk
    prompt_tokens: int = 0

    @classmethod
    def from_proto(cls, response: generation_pb2.GenerateStreamResponse) -> StreamChunk:
        stats = AcceptanceSummary.from_proto(response.stats) if response.HasField("stats") else None
        return cls(request_id=response.request_id, text=response.text,
                   token_ids=list(response.token_ids),
                   finish_reason=response.finish_reason or None, stats=stats,
                   prompt_tokens=response.prompt_tokens)


@dataclass(frozen=True)
class DrafterInfo:
    """One drafter in the gateway's pool, as the gateway sees it."""

    address: str            # HOST:PORT of the drafter's gRPC API
    drafter_id: str
    num_requests: int       # requests whose draft KV lives there now
    reserved_blocks: int    # KV blocks reserved for them
    num_blocks: int         # the drafter's KV capacity in blocks
    requests_assigned: int  # requests ever placed there (re-homed ones included)

    @classmethod
    def from_proto(cls, status: generation_pb2.DrafterStatus) -> DrafterInfo:
        return cls(address=status.address, drafter_id=status.drafter_id,
                   num_requests=status.num_requests, reserved_blocks=status.reserved_blocks,
                   num_blocks=status.num_blocks, requests_assigned=status.requests_assigned)


def drafters_from_proto(pool: generation_pb2.PoolStatus) -> list[DrafterInfo]:
    return [DrafterInfo.from_proto(status) for status in pool.drafters]


# --------------------------------------------------------------------------- requests

def build_request(prompt: str | Sequence[int], *, max_tokens: int, temperature: float,
                  top_p: float, top_k: int, stop: str | Sequence[str] | None,
                  stop_token_ids: Sequence[int] | None, ignore_eos: bool, seed: int | None,
                  request_id: str) -> generation_pb2.GenerateRequest:
    """One place that turns keyword arguments into the wire message (validation is the server's)."""
    if isinstance(stop, str):  # a lone string would otherwise become one stop per character
        stop = [stop]
    sampling = generation_pb2.SamplingOptions(
        temperature=temperature, top_p=top_p, top_k=top_k, max_tokens=max_tokens,
        stop_token_ids=list(stop_token_ids or ()), stop=list(stop or ()), ignore_eos=ignore_eos)
    if seed is not None:  # unset lets the server choose; 0 is a real seed
        sampling.seed = seed
    request = generation_pb2.GenerateRequest(sampling=sampling, request_id=request_id)
    if isinstance(prompt, str):
        request.prompt = prompt
    else:
        request.prompt_token_ids.extend(prompt)
    return request


def message_to_dict(message: Message) -> dict[str, Any]:
    """Flat message -> dict of native Python values (json_format would turn uint64 into str)."""
    return {field.name: getattr(message, field.name) for field in message.DESCRIPTOR.fields}
