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

    def __post_init__(self) -> None:
        if self.token_ids.dim() != 1 or self.token_ids.dtype != torch.int64:
            raise ValueError(f"step {self.step_id}: token_ids must be int64 [n], got "
                             f"{self.token_ids.dtype} {list(self.token_ids.shape)}")

    @property
    def num_tokens(self) -> int:
        return self.token_ids.shape[0]

    @property
    def nbytes(self) -> int:
        """Bytes the transport moves, for bandwidth figures."""
        return self.token_ids.numel() * self.token_ids.element_size()


class DraftSender(Protocol):
    """Drafter side of the data plane; reports its last completed transfer."""

    last_bytes: int

    def send(self, payload: DraftPayload) -> None: ...

    def close(self) -> None: ...


class DraftReceiver(Protocol):
    """Verifier side of the data plane; the control message supplies every size."""

    def recv(self, step_id: int, num_tokens: int, timeout_s: float = 60.0) -> DraftPayload: ...

    def close(self) -> None: ...


class _TransferMeter:
    """Bytes moved in all and in the last transfer (the drafter reports the latter per step)."""

    def __init__(self) -> None:
        self.bytes_moved = 0
        self.last_bytes = 0

    def _record(self, nbytes: int) -> None:
        self.bytes_moved += nbytes
        self.last_bytes = nbytes


def step_tag(step_id: int) -> int:
    """The tag of a step's draft tokens (when they do not fit the header), distinct per step,
    so a transfer never matches another step's.

    Gloo matches on tags; NCCL ignores them and matches in issue order, which the drafter and
    verifier keep identical because both walk the steps in order.
    """
    return step_id % (_TAG_SPACE - 1)     # stays below HEADER_TAG


HEADER_TAG = _TAG_SPACE - 1          # every payload is announced by a header on this tag


HEADER_FIELDS = 2
INLINE_TOKENS = 256   # drafts of a typical batch ride inside the header: one message, not two


def _header(payload: DraftPayload) -> torch.Tensor:
    """[step_id, num_tokens, up to INLINE_TOKENS draft tokens]: lets the verifier receive a
    payload before its control message arrives, and carries the tokens themselves when they
    fit, so a step is one message (each message costs the receiving thread a wake-up, which a
    busy core delays)."""
    header = torch.zeros(HEADER_FIELDS + INLINE_TOKENS, dtype=torch.int64)
    header[:HEADER_FIELDS] = torch.tensor([payload.step_id, payload.num_tokens])
    if payload.num_tokens <= INLINE_TOKENS:
        header[HEADER_FIELDS:HEADER_FIELDS + payload.num_tokens] = payload.token_ids.cpu()
    return header


def empty_payload(step_id: int, device: torch.device | str = "cpu") -> DraftPayload:
    """The payload of a step with no drafts: nothing crosses the wire for it."""
    return DraftPayload(step_id, torch.empty(0, dtype=torch.int64, device=device))
