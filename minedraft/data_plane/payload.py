"""What one drafter step moves, the two ends' interface, and the tags it travels under."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

VERIFIER_RANK = 0
DRAFTER_RANK = 1
_TAG_SPACE = 2**31  # process-group tags are non-negative int32


@dataclass(frozen=True)
class DraftPayload:
    """One drafter step's drafts for every request in the batch, flattened."""

    step_id: int
    token_ids: torch.Tensor              # [n] int64
    probs: torch.Tensor | None           # [n, vocab] model dtype; None for a greedy drafter

    def __post_init__(self) -> None:
        if self.token_ids.dim() != 1 or self.token_ids.dtype != torch.int64:
            raise ValueError(f"step {self.step_id}: token_ids must be int64 [n], got "
                             f"{self.token_ids.dtype} {list(self.token_ids.shape)}")
        if self.probs is not None and (self.probs.dim() != 2
                                       or self.probs.shape[0] != self.token_ids.shape[0]):
            raise ValueError(f"step {self.step_id}: probs must be [{self.token_ids.shape[0]}, "
                             f"vocab], got {list(self.probs.shape)}")

    @property
    def num_tokens(self) -> int:
        return self.token_ids.shape[0]

    @property
    def nbytes(self) -> int:
        """Bytes the transport moves, for bandwidth figures."""
        total = self.token_ids.numel() * self.token_ids.element_size()
        if self.probs is not None:
            total += self.probs.numel() * self.probs.element_size()
        return total


class DraftSender(Protocol):
    """Drafter side of the data plane; reports its last completed transfer."""

    last_bytes: int

    def send(self, payload: DraftPayload) -> None: ...

    def close(self) -> None: ...


class DraftReceiver(Protocol):
    """Verifier side of the data plane; the control message supplies every size."""

    def recv(self, step_id: int, num_tokens: int, with_probs: bool, vocab_size: int,
             dtype: torch.dtype, timeout_s: float = 60.0) -> DraftPayload: ...

    def close(self) -> None: ...


class _TransferMeter:
    """Bytes moved in all and in the last transfer (the drafter reports the latter per step)."""

    def __init__(self) -> None:
        self.bytes_moved = 0
        self.last_bytes = 0

    def _record(self, nbytes: int) -> None:
        self.bytes_moved += nbytes
        self.last_bytes = nbytes


def step_tags(step_id: int) -> tuple[int, int]:
    """Distinct (tokens, probs) tags per step, so a transfer never matches another step's.

    Gloo matches on tags; NCCL ignores them and matches in issue order, which the drafter and
    verifier keep identical because both walk the steps in order.
    """
    base = (2 * step_id) % (_TAG_SPACE - 2)   # even; base + 1 stays below HEADER_TAG
    return base, base + 1


HEADER_TAG = _TAG_SPACE - 1          # every payload is announced by a header on this tag
_DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
_CODE_DTYPES = {code: dtype for dtype, code in _DTYPE_CODES.items()}


HEADER_FIELDS = 5
INLINE_TOKENS = 256   # drafts of a typical batch ride inside the header: one message, not two


def _header(payload: DraftPayload) -> torch.Tensor:
    """[step_id, num_tokens, has_probs, vocab, dtype code, up to INLINE_TOKENS draft tokens]:
    lets the verifier receive a payload before its control message arrives, and carries the
    tokens themselves when they fit, so a greedy step is one message (each message costs the
    receiving thread a wake-up, which a busy core delays)."""
    probs = payload.probs
    header = torch.zeros(HEADER_FIELDS + INLINE_TOKENS, dtype=torch.int64)
    header[:HEADER_FIELDS] = torch.tensor([payload.step_id, payload.num_tokens, probs is not None,
                                           0 if probs is None else probs.shape[1],
                                           0 if probs is None else _DTYPE_CODES[probs.dtype]])
    if payload.num_tokens <= INLINE_TOKENS:
        header[HEADER_FIELDS:HEADER_FIELDS + payload.num_tokens] = payload.token_ids.cpu()
    return header


def empty_payload(step_id: int, with_probs: bool, vocab_size: int, dtype: torch.dtype,
                  device: torch.device | str = "cpu") -> DraftPayload:
    """The payload of a step with no drafts: nothing crosses the wire for it."""
    probs = torch.empty(0, vocab_size, dtype=dtype, device=device) if with_probs else None
    return DraftPayload(step_id, torch.empty(0, dtype=torch.int64, device=device), probs)
