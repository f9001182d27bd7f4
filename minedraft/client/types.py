"""What the SDK hands back and sends: frozen dataclasses built from the wire messages.

Callers never touch protobuf messages; this is the one place that converts them.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from google.protobuf.message import Message

from minedraft.constants import DEFAULT_GATEWAY
from minedraft.metrics import AcceptanceStats
from minedraft.v1 import generation_pb2

DEFAULT_TARGET = DEFAULT_GATEWAY


class _Default(enum.Enum):
    """Sentinel for "use the client's timeout", since None already means "no deadline"."""

    TIMEOUT = enum.auto()


CLIENT_TIMEOUT = _Default.TIMEOUT
Timeout = float | None | _Default
Prompt = str | Sequence[int]  # text, or token ids sent as they are
Speculation = Literal["auto", "off"] | int  # int N: at most N draft tokens a step; 0 = "off"
_WIRE_LIMIT = 2**32  # max_draft is a uint32


# --------------------------------------------------------------------------- results

@dataclass(frozen=True)
class AcceptanceSummary:
    """Speculative-decoding acceptance for one request, as the server reports it.

    The server fills the means from the counts with minedraft.metrics (the one definition:
    mean length includes the bonus token); `to_stats` gives the counts back in that form.
    """

    num_steps: int
    num_drafted: int
    num_accepted: int
    mean_acceptance_length: float
    acceptance_rate: float
    drafted_at: tuple[int, ...] = ()     # [j]: steps that drafted position j
    accepted_at: tuple[int, ...] = ()    # [j]: steps whose draft at position j was accepted

    def to_stats(self) -> AcceptanceStats:
        """The counts as AcceptanceStats, to merge over requests or derive rates from."""
        return AcceptanceStats(num_steps=self.num_steps, num_drafted=self.num_drafted,
                               num_accepted=self.num_accepted, drafted_at=list(self.drafted_at),
                               accepted_at=list(self.accepted_at))

    @property
    def acceptance_rate_per_position(self) -> list[float]:
        return self.to_stats().acceptance_rate_per_position

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

@dataclass(frozen=True, kw_only=True)
class SamplingOptions:
    """How to sample one request: the one list of generate/stream options and their defaults.

    Mirrors the wire's SamplingOptions; range checks are the server's, so a bad value comes
    back as InvalidRequest with the server's message. `speculation` is the exception: a value
    such as "fast" or -1 has no wire form to send, so it raises ValueError here; only its
    limit (N no more than the server's k) is the server's to check.
    """

    max_tokens: int = 64
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0            # 0 = no top-k cut
    stop: str | Sequence[str] | None = None  # a lone string is one stop string
    stop_token_ids: Sequence[int] | None = None
    ignore_eos: bool = False
    seed: int | None = None   # None lets the server choose; 0 is a real seed
    speculation: Speculation = "auto"  # "auto": the server decides; "off" or 0: no drafts; N: at most N

    def __post_init__(self) -> None:
        speculation = self.speculation
        named = isinstance(speculation, str) and speculation in ("auto", "off")
        count = isinstance(speculation, int) and not isinstance(speculation, bool)  # True is a bug
        if not named and not (count and 0 <= speculation < _WIRE_LIMIT):
            raise ValueError(f"speculation must be 'auto', 'off' or a draft length N, an int in [0, 2**32), "
                             f"got {speculation!r}")

    def replace(self, **changes: Any) -> SamplingOptions:
        """A copy with `changes` applied; a name that is not an option raises TypeError."""
        unknown = sorted(changes.keys() - _OPTION_NAMES)
        if unknown:
            raise TypeError(f"unknown sampling option(s) {', '.join(map(repr, unknown))}; "
                            f"expected any of {', '.join(sorted(_OPTION_NAMES))}")
        return dataclasses.replace(self, **changes)

    def to_proto(self) -> generation_pb2.SamplingOptions:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or ())
        sampling = generation_pb2.SamplingOptions(
            temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
            max_tokens=self.max_tokens, stop_token_ids=list(self.stop_token_ids or ()), stop=stop,
            ignore_eos=self.ignore_eos)
        if self.seed is not None:  # unset lets the server choose
            sampling.seed = self.seed
        if self.speculation != "auto":  # unset lets the server decide
            sampling.max_draft = 0 if self.speculation == "off" else self.speculation
        return sampling


_OPTION_NAMES = frozenset(field.name for field in dataclasses.fields(SamplingOptions))


def build_request(prompt: Prompt, options: SamplingOptions | None = None, *, request_id: str = "",
                  **overrides: Any) -> generation_pb2.GenerateRequest:
    """The wire message for one prompt: `options` (default SamplingOptions()) with `overrides`."""
    if options is None:
        options = SamplingOptions()
    elif not isinstance(options, SamplingOptions):
        raise TypeError(f"options must be a SamplingOptions, got {type(options).__name__}")
    sampling = options.replace(**overrides)
    request = generation_pb2.GenerateRequest(sampling=sampling.to_proto(), request_id=request_id)
    if isinstance(prompt, str):
        request.prompt = prompt
    else:
        request.prompt_token_ids.extend(prompt)
    return request


def message_to_dict(message: Message) -> dict[str, Any]:
    """Message -> dict of native Python values (json_format would turn uint64 into str):
    nested messages become dicts (None when unset), repeated fields lists, maps dicts."""
    out: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            out[field.name] = dict(value)
        elif field.message_type is not None and field.is_repeated:
            out[field.name] = [message_to_dict(v) for v in value]
        elif field.message_type is not None:
            out[field.name] = message_to_dict(value) if message.HasField(field.name) else None
        elif field.is_repeated:
            out[field.name] = list(value)
        else:
            out[field.name] = value
    return out
