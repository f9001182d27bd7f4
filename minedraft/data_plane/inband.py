"""In-band fallback: payloads ride the verifier's PutDrafts RPC (made by the services)."""

from __future__ import annotations

import threading
from typing import Callable

import numpy as np
import torch

from minedraft.data_plane.payload import DraftPayload, _TransferMeter, empty_payload

# dtype -> (little-endian numpy dtype of the raw bytes, torch dtype to view the tensor as first).
# bfloat16 has no numpy dtype, so its bits travel as int16.
_WIRE_DTYPES: dict[torch.dtype, tuple[str, torch.dtype]] = {
    torch.int64: ("<i8", torch.int64),
    torch.float32: ("<f4", torch.float32),
    torch.float16: ("<f2", torch.float16),
    torch.bfloat16: ("<i2", torch.int16),
}
_DTYPE_NAMES: dict[str, torch.dtype] = {"float32": torch.float32, "float16": torch.float16,
                                        "bfloat16": torch.bfloat16}


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

    def recv(self, step_id: int, num_tokens: int, with_probs: bool, vocab_size: int,
             dtype: torch.dtype, timeout_s: float = 60.0) -> DraftPayload:
        with self._ready:
            arrived = self._ready.wait_for(
                lambda: step_id in self._pending or self._closed, timeout=timeout_s)
            if self._closed:
                raise RuntimeError(f"data plane closed while waiting for step {step_id}")
            if not arrived:
                raise TimeoutError(f"no drafts arrived for step {step_id} within {timeout_s}s")
            payload = self._pending.pop(step_id)
        payload = _check_payload(payload, num_tokens, with_probs, vocab_size, dtype)
        self._record(payload.nbytes)
        return payload

    def close(self) -> None:
        with self._ready:
            self._closed = True
            self._pending.clear()
            self._ready.notify_all()


def _check_payload(payload: DraftPayload, num_tokens: int, with_probs: bool, vocab_size: int,
                   dtype: torch.dtype) -> DraftPayload:
    """Hold an in-band payload to what the control message promised."""
    step = payload.step_id
    if payload.num_tokens != num_tokens:
        raise ValueError(f"step {step}: expected {num_tokens} draft tokens, got "
                         f"{payload.num_tokens}")
    if num_tokens == 0:  # zero rows carry no vocab width; normalise the shape
        return empty_payload(step, with_probs, vocab_size, dtype)
    if not with_probs:
        if payload.probs is not None:
            raise ValueError(f"step {step}: expected no draft probs, got some")
        return payload
    if payload.probs is None:
        raise ValueError(f"step {step}: expected draft probs, got none")
    if payload.probs.shape != (num_tokens, vocab_size) or payload.probs.dtype != dtype:
        raise ValueError(f"step {step}: expected draft probs {dtype} [{num_tokens}, "
                         f"{vocab_size}], got {payload.probs.dtype} "
                         f"{list(payload.probs.shape)}")
    return payload


def _to_bytes(tensor: torch.Tensor) -> bytes:
    wire_np, view_as = _WIRE_DTYPES[tensor.dtype]
    host = tensor.detach().cpu().contiguous().view(view_as)
    return host.numpy().astype(wire_np, copy=False).tobytes()


def _from_bytes(raw: bytes, dtype: torch.dtype) -> torch.Tensor:
    wire_np, view_as = _WIRE_DTYPES[dtype]
    array = np.frombuffer(raw, dtype=wire_np).astype(np.dtype(wire_np).newbyteorder("="))
    return torch.from_numpy(array).view(dtype)


def encode_payload(payload: DraftPayload) -> dict[str, int | bytes | str]:
    """Fields of the `minedraft.v1.DraftPayload` message; empty probs bytes mean greedy."""
    probs = payload.probs
    return {
        "step_id": payload.step_id,
        "draft_token_ids": _to_bytes(payload.token_ids),
        "draft_probs": b"" if probs is None else _to_bytes(probs),
        "probs_dtype": "" if probs is None else str(probs.dtype).removeprefix("torch."),
        "num_tokens": payload.num_tokens,
    }


def decode_payload(step_id: int, draft_token_ids: bytes, draft_probs: bytes, probs_dtype: str,
                   num_tokens: int) -> DraftPayload:
    """Inverse of `encode_payload`; the vocab width follows from the byte count."""
    token_ids = _from_bytes(draft_token_ids, torch.int64)
    if token_ids.numel() != num_tokens:
        raise ValueError(f"step {step_id}: num_tokens={num_tokens} but "
                         f"{token_ids.numel()} token ids arrived")
    if not probs_dtype:
        return DraftPayload(step_id, token_ids, None)
    if probs_dtype not in _DTYPE_NAMES:
        raise ValueError(f"step {step_id}: unsupported probs dtype {probs_dtype!r}; "
                         f"expected one of {sorted(_DTYPE_NAMES)}")
    flat = _from_bytes(draft_probs, _DTYPE_NAMES[probs_dtype])
    if num_tokens == 0:
        return DraftPayload(step_id, token_ids, flat.view(0, 0))
    if flat.numel() % num_tokens:
        raise ValueError(f"step {step_id}: {flat.numel()} probs do not split into "
                         f"{num_tokens} rows")
    return DraftPayload(step_id, token_ids, flat.view(num_tokens, -1))
