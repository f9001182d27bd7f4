"""torch.distributed transport: gloo on CPU, NCCL on GPU, one private pair group each."""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from minedraft.data_plane.payload import (DRAFTER_RANK, HEADER_FIELDS, HEADER_TAG, INLINE_TOKENS, VERIFIER_RANK,
                                          DraftPayload, MailboxReceiver, _header, _TransferMeter, check_payload,
                                          step_tag)
from minedraft.process_groups import check_backend, master_store, new_group


def listen_store(host: str, port: int = 0, timeout_s: float = 60.0) -> dist.TCPStore:
    """The verifier's rendezvous store for one pairing; port 0 takes any free port
    (read it back from `store.port`), so pairings never collide on one host."""
    return master_store(host, port, 2, timedelta(seconds=timeout_s), wait_for_workers=False)


def _form_pair_group(host: str, port: int, rank: int, backend: str, device: torch.device,
                     timeout: timedelta, store: dist.TCPStore | None = None
                     ) -> tuple[dist.TCPStore, dist.Backend]:
    """A private two-rank group: its own store, constructed directly, no default group."""
    check_backend(backend, device, "data-plane")
    if store is None:
        store = (master_store(host, port, 2, timeout) if rank == VERIFIER_RANK
                 else dist.TCPStore(host, port, world_size=2, is_master=False, timeout=timeout))
    return store, new_group(store, rank, 2, backend, device, timeout)


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
                 device: torch.device | str, connect_timeout_s: float,
                 store: dist.TCPStore | None = None) -> None:
        super().__init__()
        self.device = torch.device(device)
        self.backend = backend
        self._store, self._group = _form_pair_group(
            host, port, rank, backend, self.device, timedelta(seconds=connect_timeout_s), store)

    def close(self) -> None:
        """Release the communicator; the store goes with this object."""
        self._group.shutdown()


class DistributedDraftSender(_DistributedEnd):
    """Drafter end (rank 1). `send` returns once the verifier has taken the tensors.

    Gloo holds a send until the matching recv is posted: the transfer is timed where it is
    received (the verifier's recv_s), which is where the wait shows.
    """

    def __init__(self, host: str, port: int, backend: str = "gloo",
                 device: torch.device | str = "cpu", connect_timeout_s: float = 60.0,
                 send_timeout_s: float = 60.0) -> None:
        super().__init__(host, port, DRAFTER_RANK, backend, device, connect_timeout_s)
        self._send_timeout = timedelta(seconds=send_timeout_s)

    def send(self, payload: DraftPayload) -> None:
        if payload.num_tokens == 0:
            return
        tensors = [(_header(payload), HEADER_TAG, "header")]
        if payload.num_tokens > INLINE_TOKENS:
            tensors.append((payload.token_ids, step_tag(payload.step_id), "draft tokens"))
        for tensor, tag, what in tensors:
            on_device = tensor.to(self.device).contiguous()
            work = self._group.send([on_device], VERIFIER_RANK, tag)
            _wait(work, self._send_timeout, payload.step_id, f"sending {what}")
        self._record(payload.nbytes)


class DistributedDraftReceiver(MailboxReceiver, _DistributedEnd):
    """Verifier end (rank 0, hosts the store). Tensors arrive on `device`.

    With gloo a thread keeps a receive posted at all times: gloo completes a send only when
    the matching receive exists, so without it the drafter's send (and the transfer) would
    wait until the verifier asks for that step. Payloads wait here, keyed by step id. With
    NCCL, which matches in issue order on the device, `recv` receives in the caller.
    """

    def __init__(self, host: str, port: int, backend: str = "gloo",
                 device: torch.device | str = "cpu", connect_timeout_s: float = 60.0,
                 store: dist.TCPStore | None = None) -> None:
        """store: a `listen_store` made beforehand (so its port can be handed to the drafter
        before this blocks until the drafter joins); host and port are then unused."""
        MailboxReceiver.__init__(self)
        _DistributedEnd.__init__(self, host, port, VERIFIER_RANK, backend, device, connect_timeout_s, store)
        if backend == "gloo":
            self._start_receiving()

    def _receive_one(self, timeout: timedelta) -> DraftPayload:
        header = torch.empty(HEADER_FIELDS + INLINE_TOKENS, dtype=torch.int64, device=self.device)
        _wait(self._group.recv([header], DRAFTER_RANK, HEADER_TAG), timeout, -1, "receiving a header")
        step_id, num_tokens = header[:HEADER_FIELDS].tolist()
        if num_tokens <= INLINE_TOKENS:
            token_ids = header[HEADER_FIELDS:HEADER_FIELDS + num_tokens].clone()
        else:
            token_ids = torch.empty(num_tokens, dtype=torch.int64, device=self.device)
            _wait(self._group.recv([token_ids], DRAFTER_RANK, step_tag(step_id)), timeout, step_id,
                  "receiving draft tokens")
        return DraftPayload(step_id, token_ids)

    def _receive_next(self) -> DraftPayload:
        return self._receive_one(timedelta(days=365))

    def recv(self, step_id: int, num_tokens: int, timeout_s: float = 60.0) -> DraftPayload:
        if self._thread is not None or num_tokens == 0:
            return super().recv(step_id, num_tokens, timeout_s)
        self.last_wait_s = 0.0              # NCCL: waiting and receiving are one, in this call
        payload = check_payload(self._receive_one(timedelta(seconds=timeout_s)), step_id, num_tokens)
        self._record(payload.nbytes)
        return payload

    def abandon(self, step_id: int) -> None:
        """Only with a receiving thread (gloo): NCCL receives in the verify step itself, in
        issue order, so a step whose drafts will not come cannot be skipped."""
        if self._thread is None:
            raise NotImplementedError(f"the {self.backend} data plane cannot abandon a step's drafts")
        super().abandon(step_id)

    def close(self) -> None:
        self._mark_closed()
        _DistributedEnd.close(self)


def connect_pair(role: str, host: str, port: int, backend: str = "gloo",
                 device: torch.device | str = "cpu", connect_timeout_s: float = 60.0
                 ) -> DistributedDraftSender | DistributedDraftReceiver:
    """Open this side of a drafter-verifier pair; blocks until the peer joins."""
    if role == "drafter":
        return DistributedDraftSender(host, port, backend, device, connect_timeout_s)
    if role == "verifier":
        return DistributedDraftReceiver(host, port, backend, device, connect_timeout_s)
    raise ValueError(f"data-plane role must be 'drafter' or 'verifier', got {role!r}")
