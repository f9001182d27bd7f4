"""In-band fallback: payloads ride the verifier's PutDrafts RPC (made by the services)."""

from __future__ import annotations

from typing import Callable

import torch
from safetensors import SafetensorError
from safetensors.numpy import load as load_arrays
from safetensors.numpy import save as save_arrays

from minedraft.data_plane.payload import DraftPayload, Mailbox, MailboxReceiver, _TransferMeter

# The payload's bytes are a safetensors blob holding this one tensor: the format says dtype,
# shape and byte order itself (little-endian whatever the host's), and is checked on load.
# Its numpy functions, not its torch ones: a fifth of the time for a step's few ids.
_WIRE_NAME = "draft_token_ids"


class InBandDraftSender(_TransferMeter):
    """Hands payloads to `put`, which the drafter service backs with the PutDrafts RPC."""

    def __init__(self, put: Callable[[DraftPayload], None]) -> None:
        super().__init__()
        self._put = put

    def send(self, payload: DraftPayload) -> None:
        self._put(payload)
        self._record(payload.nbytes)

    def close(self) -> None:
        pass


class InBandDraftReceiver(MailboxReceiver):
    """Payloads delivered by the RPC thread wait here until the step loop asks for them.

    Keyed by step id, so deliveries may arrive in any order relative to each other and to recv.
    """

    def deliver(self, payload: DraftPayload) -> None:
        self._put(payload)

    def close(self) -> None:
        with self._cond:
            self._mailbox = Mailbox()
        self._mark_closed()


def encode_payload(payload: DraftPayload) -> dict[str, int | bytes]:
    """Fields of the `minedraft.v1.DraftPayload` message."""
    return {
        "step_id": payload.step_id,
        "draft_token_ids": save_arrays({_WIRE_NAME: payload.token_ids.detach().cpu().contiguous().numpy()}),
        "num_tokens": payload.num_tokens,
    }


def decode_payload(step_id: int, draft_token_ids: bytes, num_tokens: int) -> DraftPayload:
    """Inverse of `encode_payload`; refuses bytes that are not one int64 [num_tokens] tensor."""
    try:
        arrays = load_arrays(draft_token_ids)
        tensors = {name: torch.from_numpy(array) for name, array in arrays.items()}
    except (SafetensorError, KeyError, TypeError, ValueError) as err:    # not safetensors; a dtype numpy lacks
        raise ValueError(f"step {step_id}: draft token ids are not a safetensors payload ({err})") from None
    if tensors.keys() != {_WIRE_NAME}:
        raise ValueError(f"step {step_id}: expected the one tensor {_WIRE_NAME!r}, got {sorted(tensors)}")
    payload = DraftPayload(step_id, tensors[_WIRE_NAME])      # checks int64 [n]
    if payload.num_tokens != num_tokens:
        raise ValueError(f"step {step_id}: num_tokens={num_tokens} but {payload.num_tokens} token ids arrived")
    return payload
