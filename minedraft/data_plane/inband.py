"""In-band fallback: payloads ride the verifier's PutDrafts RPC (made by the services)."""

from __future__ import annotations

import threading
from typing import Callable

import numpy as np
import torch

from minedraft.data_plane.payload import DraftPayload, _TransferMeter

_WIRE_TOKENS = "<i8"   # token ids travel as little-endian int64 whatever the host's byte order


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


class InBandDraftReceiver(_TransferMeter):
    """Payloads delivered by the RPC thread wait here until the step loop asks for them.

    Keyed by step id, so deliveries may arrive in any order relative to each other and to recv.
    """

    def __init__(self) -> None:
        super().__init__()
        self._ready = threading.Condition()
        self._pending: dict[int, DraftPayload] = {}
        self._closed = False

    def deliver(self, payload: DraftPayload) -> None:
        with self._ready:
            if self._closed:
                raise RuntimeError(f"data plane closed; dropping drafts for step {payload.step_id}")
            if payload.step_id in self._pending:
                raise ValueError(f"drafts for step {payload.step_id} delivered twice")
            self._pending[payload.step_id] = payload
            self._ready.notify_all()

    def recv(self, step_id: int, num_tokens: int, timeout_s: float = 60.0) -> DraftPayload:
        with self._ready:
            arrived = self._ready.wait_for(
                lambda: step_id in self._pending or self._closed, timeout=timeout_s)
            if self._closed:
                raise RuntimeError(f"data plane closed while waiting for step {step_id}")
            if not arrived:
                raise TimeoutError(f"no drafts arrived for step {step_id} within {timeout_s}s")
            payload = self._pending.pop(step_id)
        payload = _check_payload(payload, num_tokens)
        self._record(payload.nbytes)
        return payload

    def close(self) -> None:
        with self._ready:
            self._closed = True
            self._pending.clear()
            self._ready.notify_all()


def _check_payload(payload: DraftPayload, num_tokens: int) -> DraftPayload:
    """Hold an in-band payload to what the control message promised."""
    if payload.num_tokens != num_tokens:
        raise ValueError(f"step {payload.step_id}: expected {num_tokens} draft tokens, got "
                         f"{payload.num_tokens}")
    return payload


def encode_payload(payload: DraftPayload) -> dict[str, int | bytes]:
    """Fields of the `minedraft.v1.DraftPayload` message."""
    host = payload.token_ids.detach().cpu().contiguous().numpy()
    return {
        "step_id": payload.step_id,
        "draft_token_ids": host.astype(_WIRE_TOKENS, copy=False).tobytes(),
        "num_tokens": payload.num_tokens,
    }


def decode_payload(step_id: int, draft_token_ids: bytes, num_tokens: int) -> DraftPayload:
    """Inverse of `encode_payload`."""
    if len(draft_token_ids) % 8:
        raise ValueError(f"step {step_id}: {len(draft_token_ids)} bytes of token ids are not whole int64s")
    array = np.frombuffer(draft_token_ids, dtype=_WIRE_TOKENS).astype(np.int64)
    if array.size != num_tokens:
        raise ValueError(f"step {step_id}: num_tokens={num_tokens} but {array.size} token ids arrived")
    return DraftPayload(step_id, torch.from_numpy(array))
