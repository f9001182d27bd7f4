"""The data plane: moves one drafter step's draft tokens (and probabilities) to the verifier.

Control messages (small, over gRPC) tell the verifier how many drafts a step carries, whether
probabilities come with them, the vocabulary size and the dtype; so the bulk tensors travel here
without any header. Two transports share one interface:

- `DistributedDraftSender` / `DistributedDraftReceiver`: torch.distributed point-to-point on a
  two-rank process group built from its own `TCPStore`, never the global default group, so one
  verifier process can pair with several drafters (one rendezvous port each). Gloo on CPU, NCCL
  on GPU. The verifier is rank 0 and hosts the store; the drafter is rank 1.
- `InBandDraftSender` / `InBandDraftReceiver`: the fallback when no process group can be formed;
  payloads ride a gRPC call (`PutDrafts`) that the services make. This module stays free of gRPC
  and protobuf: `encode_payload` / `decode_payload` convert to and from the message's fields.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable, Protocol

import numpy as np
import torch
import torch.distributed as dist

VERIFIER_RANK = 0
DRAFTER_RANK = 1
_TAG_SPACE = 2**31  # process-group tags are non-negative int32

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
    """Drafter side of the data plane."""

    def send(self, payload: DraftPayload) -> None: ...

    def close(self) -> None: ...


class DraftReceiver(Protocol):
    """Verifier side of the data plane; the control message supplies every size."""

    def recv(self, step_id: int, num_tokens: int, with_probs: bool, vocab_size: int,
             dtype: torch.dtype, timeout_s: float = 60.0) -> DraftPayload: ...

    def close(self) -> None: ...


class _TransferMeter:
    """Cumulative and last-transfer bytes and seconds, read by benchmarks."""

    def __init__(self) -> None:
        self.bytes_moved = 0
        self.seconds = 0.0
        self.last_bytes = 0
        self.last_seconds = 0.0

    def _record(self, nbytes: int, seconds: float) -> None:
        self.bytes_moved += nbytes
        self.seconds += seconds
        self.last_bytes = nbytes
        self.last_seconds = seconds


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


def _header(payload: DraftPayload) -> torch.Tensor:
    """[step_id, num_tokens, has_probs, vocab, dtype code]: lets the verifier receive a
    payload before its control message arrives."""
    probs = payload.probs
    return torch.tensor([payload.step_id, payload.num_tokens, probs is not None,
                         0 if probs is None else probs.shape[1],
                         0 if probs is None else _DTYPE_CODES[probs.dtype]], dtype=torch.int64)


def empty_payload(step_id: int, with_probs: bool, vocab_size: int, dtype: torch.dtype,
                  device: torch.device | str = "cpu") -> DraftPayload:
    """The payload of a step with no drafts: nothing crosses the wire for it."""
    probs = torch.empty(0, vocab_size, dtype=dtype, device=device) if with_probs else None
    return DraftPayload(step_id, torch.empty(0, dtype=torch.int64, device=device), probs)


# ---------------------------------------------------------------- torch.distributed transport

def _form_pair_group(host: str, port: int, rank: int, backend: str, device: torch.device,
                     timeout: timedelta) -> tuple[dist.TCPStore, dist.Backend]:
    """A private two-rank group: its own store, constructed directly, no default group."""
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"data-plane backend must be 'gloo' or 'nccl', got {backend!r}")
    if backend == "nccl" and device.type != "cuda":
        raise ValueError(f"backend 'nccl' needs a cuda device, got {device}")
    store = dist.TCPStore(host, port, world_size=2, is_master=(rank == VERIFIER_RANK),
                          timeout=timeout)
    if backend == "gloo":
        return store, dist.ProcessGroupGloo(store, rank, 2, timeout)
    if not hasattr(dist, "ProcessGroupNCCL"):
        raise RuntimeError("backend 'nccl' requested but this torch build has no NCCL")
    torch.cuda.set_device(device)       # NCCL binds its communicator to the current device
    options = dist.ProcessGroupNCCL.Options()
    options._timeout = timeout
    return store, dist.ProcessGroupNCCL(store, rank, 2, options)


def _wait(work: dist.Work, timeout: timedelta, step_id: int, what: str) -> None:
    try:
        work.wait(timeout)
    except RuntimeError as err:
        if "timed out" in str(err).lower() or "timeout" in str(err).lower():
            raise TimeoutError(f"data plane: {what} for step {step_id} timed out after "
                               f"{timeout.total_seconds():.1f}s; the pair is now unusable, "
                               f"close it and reconnect") from err
        raise


class _DistributedEnd(_TransferMeter):
    def __init__(self, host: str, port: int, rank: int, backend: str,
                 device: torch.device | str, connect_timeout_s: float) -> None:
        super().__init__()
        self.device = torch.device(device)
        self.backend = backend
        self._store, self._group = _form_pair_group(
            host, port, rank, backend, self.device, timedelta(seconds=connect_timeout_s))

    def close(self) -> None:
        """Release the communicator; the store goes with this object."""
        self._group.shutdown()


class DistributedDraftSender(_DistributedEnd):
    """Drafter end (rank 1). `send` returns once the verifier has taken the tensors.

    Gloo holds a send until the matching recv is posted, so `last_seconds` includes any time
    spent waiting for the verifier, not only wire time.
    """

    def __init__(self, host: str, port: int, backend: str = "gloo",
                 device: torch.device | str = "cpu", connect_timeout_s: float = 60.0,
                 send_timeout_s: float = 60.0) -> None:
        super().__init__(host, port, DRAFTER_RANK, backend, device, connect_timeout_s)
        self._send_timeout = timedelta(seconds=send_timeout_s)

    def send(self, payload: DraftPayload) -> None:
        if payload.num_tokens == 0:
            return
        start = time.perf_counter()
        tokens_tag, probs_tag = step_tags(payload.step_id)
        tensors = [(_header(payload), HEADER_TAG, "header"), (payload.token_ids, tokens_tag, "draft tokens")]
        if payload.probs is not None:
            tensors.append((payload.probs, probs_tag, "draft probs"))
        for tensor, tag, what in tensors:
            on_device = tensor.to(self.device).contiguous()
            work = self._group.send([on_device], VERIFIER_RANK, tag)
            _wait(work, self._send_timeout, payload.step_id, f"sending {what}")
        self._record(payload.nbytes, time.perf_counter() - start)


class DistributedDraftReceiver(_DistributedEnd):
    """Verifier end (rank 0, hosts the store). Tensors arrive on `device`.

    With gloo a thread keeps a receive posted at all times: gloo completes a send only when
    the matching receive exists, so without it the drafter's send (and the transfer) would
    wait until the verifier asks for that step. Payloads wait here, keyed by step id. With
    NCCL, which matches in issue order on the device, `recv` receives in the caller.
    """

    def __init__(self, host: str, port: int, backend: str = "gloo",
                 device: torch.device | str = "cpu", connect_timeout_s: float = 60.0) -> None:
        super().__init__(host, port, VERIFIER_RANK, backend, device, connect_timeout_s)
        self._ready: dict[int, DraftPayload] = {}
        self._error: BaseException | None = None
        self._cond = threading.Condition()
        self._closed = False
        self._thread = None
        if backend == "gloo":
            self._thread = threading.Thread(target=self._receive_forever, name="draft-recv", daemon=True)
            self._thread.start()

    def _receive_one(self, timeout: timedelta) -> DraftPayload:
        header = torch.empty(5, dtype=torch.int64)
        header_on_device = header.to(self.device)
        _wait(self._group.recv([header_on_device], DRAFTER_RANK, HEADER_TAG), timeout, -1, "receiving a header")
        step_id, num_tokens, has_probs, vocab, dtype_code = header_on_device.tolist()
        tokens_tag, probs_tag = step_tags(step_id)
        token_ids = torch.empty(num_tokens, dtype=torch.int64, device=self.device)
        _wait(self._group.recv([token_ids], DRAFTER_RANK, tokens_tag), timeout, step_id, "receiving draft tokens")
        probs = None
        if has_probs:
            probs = torch.empty(num_tokens, vocab, dtype=_CODE_DTYPES[dtype_code], device=self.device)
            _wait(self._group.recv([probs], DRAFTER_RANK, probs_tag), timeout, step_id, "receiving draft probs")
        return DraftPayload(step_id, token_ids, probs)

    def _receive_forever(self) -> None:
        while not self._closed:
            try:
                payload = self._receive_one(timedelta(days=365))
            except BaseException as err:                      # closed, or the peer went away
                with self._cond:
                    self._error = None if self._closed else err
                    self._cond.notify_all()
                return
            with self._cond:
                self._ready[payload.step_id] = payload
                self._cond.notify_all()

    def recv(self, step_id: int, num_tokens: int, with_probs: bool, vocab_size: int,
             dtype: torch.dtype, timeout_s: float = 60.0) -> DraftPayload:
        if num_tokens == 0:
            return empty_payload(step_id, with_probs, vocab_size, dtype, self.device)
        start = time.perf_counter()
        if self._thread is None:
            payload = self._receive_one(timedelta(seconds=timeout_s))
        else:
            with self._cond:
                arrived = self._cond.wait_for(lambda: step_id in self._ready or self._error is not None,
                                              timeout_s)
                if self._error is not None:
                    raise RuntimeError(f"data plane: receiving failed before step {step_id}") from self._error
                if not arrived:
                    raise TimeoutError(f"data plane: no drafts for step {step_id} after {timeout_s:.1f}s")
                payload = self._ready.pop(step_id)
        expected = (step_id, num_tokens, vocab_size if with_probs else None, dtype if with_probs else None)
        got = (payload.step_id, payload.num_tokens,
               None if payload.probs is None else payload.probs.shape[1],
               None if payload.probs is None else payload.probs.dtype)
        if got != expected:
            raise ValueError(f"data plane: step {step_id} expected (step, tokens, vocab, dtype) "
                             f"{expected}, received {got}")
        self._record(payload.nbytes, time.perf_counter() - start)
        return payload

    def close(self) -> None:
        self._closed = True
        super().close()


def connect_pair(role: str, host: str, port: int, backend: str = "gloo",
                 device: torch.device | str = "cpu", connect_timeout_s: float = 60.0
                 ) -> DistributedDraftSender | DistributedDraftReceiver:
    """Open this side of a drafter-verifier pair; blocks until the peer joins."""
    if role == "drafter":
        return DistributedDraftSender(host, port, backend, device, connect_timeout_s)
    if role == "verifier":
        return DistributedDraftReceiver(host, port, backend, device, connect_timeout_s)
    raise ValueError(f"data-plane role must be 'drafter' or 'verifier', got {role!r}")


# ---------------------------------------------------------------- in-band (gRPC) fallback

class InBandDraftSender(_TransferMeter):
    """Hands payloads to `put`, which the drafter service backs with the PutDrafts RPC."""

    def __init__(self, put: Callable[[DraftPayload], None]) -> None:
        super().__init__()
        self._put = put

    def send(self, payload: DraftPayload) -> None:
        start = time.perf_counter()
        self._put(payload)
        self._record(payload.nbytes, time.perf_counter() - start)

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
        start = time.perf_counter()
        with self._ready:
            arrived = self._ready.wait_for(
                lambda: step_id in self._pending or self._closed, timeout=timeout_s)
            if self._closed:
                raise RuntimeError(f"data plane closed while waiting for step {step_id}")
            if not arrived:
                raise TimeoutError(f"no drafts arrived for step {step_id} within {timeout_s}s")
            payload = self._pending.pop(step_id)
        payload = _check_payload(payload, num_tokens, with_probs, vocab_size, dtype)
        self._record(payload.nbytes, time.perf_counter() - start)
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
