"""The verifier's ends of the data plane: one pairing per drafter in the pool.

A drafter joining the pool asks for a pairing (`connect`): in-band it is a mailbox for its
PutDrafts calls; with gloo or NCCL it is a private two-rank group on a fresh rendezvous
store (any free port); with `unix` a socket of its own in the verifier's private socket
directory. The last two are formed on a background thread while the drafter joins from its
side. Nothing here restarts when the pool changes.

A pairing that fails (its drafter died, so gloo reports the connection closed; or its
drafts never came) is dropped, and `recv` answers None: the caller verifies those
requests without drafts (a plain autoregressive step, which is lossless) instead of
failing the batch.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import threading
from functools import partial
from typing import Callable

import torch

from minedraft.constants import DATA_PLANES
from minedraft.data_plane.distributed import DistributedDraftReceiver, listen_store
from minedraft.data_plane.inband import InBandDraftReceiver
from minedraft.data_plane.local import LocalDraftReceiver, SocketDirectory, listen_socket
from minedraft.data_plane.payload import DraftPayload, DraftReceiver, DraftsAbandoned

logger = logging.getLogger("minedraft.data_plane")


class _Pairing:
    def __init__(self) -> None:
        self.formed = threading.Event()
        self.key = secrets.token_hex(16)
        self.receiver: DraftReceiver | None = None
        self.error: BaseException | None = None


class DraftPairings:
    def __init__(self, backend: str, bind_host: str, advertise_host: str,
                 device: torch.device | str = "cpu", connect_timeout_s: float = 120.0) -> None:
        if backend not in DATA_PLANES:
            raise ValueError(f"data plane must be one of {DATA_PLANES}, got {backend!r}")
        self.backend = backend
        self.bind_host, self.advertise_host = bind_host, advertise_host
        self.device = torch.device(device)
        self.connect_timeout_s = connect_timeout_s
        self._pairings: dict[str, _Pairing] = {}
        self._ever_paired: set[str] = set()     # drafts of these, when unpaired, are lost, not unknown
        self._sockets = SocketDirectory() if backend == "unix" else None
        self.last_wait_s = 0.0                  # of the last recv (only the verify thread calls it)
        self._lock = threading.Lock()

    def __contains__(self, drafter_id: str) -> bool:
        return drafter_id in self._pairings

    def ever_paired(self, drafter_id: str) -> bool:
        """Whether this drafter paired with this verifier at some time (it may have left since)."""
        return drafter_id in self._ever_paired

    def connect(self, drafter_id: str, pairing_key: str = "") -> tuple[str, str]:
        """Open a pairing for a joining drafter; -> (the rendezvous address it must join,
        '' in-band; the pairing's key). A drafter that connects again replaces its old
        pairing, but only with the key it was given: nobody else can take over its drafts."""
        if not drafter_id:
            raise ValueError("drafter_id: empty")
        self.check_key(drafter_id, pairing_key)
        self.disconnect(drafter_id)
        pairing = _Pairing()
        if self.backend == "inband":
            pairing.receiver = InBandDraftReceiver()
            pairing.formed.set()
            address = ""
        else:
            if self._sockets is not None:
                address = self._sockets.socket_path(secrets.token_hex(8))
                listener = listen_socket(address)
                open_receiver = partial(LocalDraftReceiver, listener, pairing.key, self.device,
                                        self.connect_timeout_s)
            else:
                store = listen_store(self.bind_host, 0, self.connect_timeout_s)
                address = f"{self.advertise_host}:{store.port}"
                open_receiver = partial(DistributedDraftReceiver, self.bind_host, store.port, backend=self.backend,
                                        device=self.device, connect_timeout_s=self.connect_timeout_s, store=store)
            threading.Thread(target=self._form, args=(drafter_id, pairing, open_receiver),
                             name=f"pair-{drafter_id[:8]}", daemon=True).start()
        with self._lock:
            self._pairings[drafter_id] = pairing
            self._ever_paired.add(drafter_id)
        return address, pairing.key

    def check_key(self, drafter_id: str, pairing_key: str) -> None:
        """Raises PermissionError unless the drafter is unpaired or the key is its pairing's."""
        pairing = self._pairings.get(drafter_id)
        if pairing is not None and not hmac.compare_digest(pairing.key, pairing_key):
            raise PermissionError(f"drafter_id: {drafter_id!r} is paired already; only that drafter, "
                                  f"with its pairing_key, may pair again or leave")

    def _form(self, drafter_id: str, pairing: _Pairing, open_receiver: Callable[[], DraftReceiver]) -> None:
        """On its own thread: open_receiver blocks until the drafter joins its end."""
        try:
            pairing.receiver = open_receiver()
            logger.info("data plane %s paired with drafter %s", self.backend, drafter_id)
        except BaseException as err:                      # the drafter never joined
            pairing.error = err
            logger.warning("drafter %s did not join its data-plane pairing: %s", drafter_id, err)
        finally:
            pairing.formed.set()

    def deliver(self, drafter_id: str, payload: DraftPayload) -> None:
        """In-band: a PutDrafts call's payload."""
        pairing = self._pairings.get(drafter_id)
        if pairing is None or not isinstance(pairing.receiver, InBandDraftReceiver):
            raise KeyError(f"drafter_id: {drafter_id!r} has no in-band pairing with this verifier")
        pairing.receiver.deliver(payload)

    def recv(self, drafter_id: str, step_id: int, num_tokens: int,
             timeout_s: float = 60.0) -> DraftPayload | None:
        """One drafter step's drafts, or None when they are lost with their drafter or were
        abandoned (`abandon`). last_wait_s: how long it waited for drafts not there yet."""
        self.last_wait_s = 0.0
        pairing = self._pairings.get(drafter_id)
        if pairing is None:
            logger.warning("step %d: drafts from unknown drafter %s are lost", step_id, drafter_id)
            return None
        try:
            if not pairing.formed.wait(timeout_s) or pairing.receiver is None:
                raise TimeoutError(f"pairing with drafter {drafter_id} not formed") from pairing.error
            payload = pairing.receiver.recv(step_id, num_tokens, timeout_s)
            self.last_wait_s = pairing.receiver.last_wait_s
        except DraftsAbandoned:
            logger.debug("drafter %s: drafts of step %d abandoned", drafter_id, step_id)
            return None
        except (RuntimeError, TimeoutError, ValueError) as err:   # ValueError: not the drafts promised
            logger.warning("drafter %s: drafts of step %d lost (%s); dropping its pairing",
                           drafter_id, step_id, err)
            self.disconnect(drafter_id)
            return None
        return payload

    @property
    def can_abandon(self) -> bool:
        """Whether a step's drafts can be given up on while a verify step waits for them:
        not with NCCL, which receives in the step itself, in issue order."""
        return self.backend != "nccl"

    def abandon(self, drafter_id: str, step_id: int) -> None:
        """The drafts of this drafter step will not come: a verify step waiting for them goes
        on without them, and any that arrive after all are dropped. A drafter not paired
        (any more) has nothing to abandon."""
        if not self.can_abandon:
            raise NotImplementedError(f"the {self.backend} data plane cannot abandon a step's drafts")
        pairing = self._pairings.get(drafter_id)
        if pairing is not None and pairing.receiver is not None:
            pairing.receiver.abandon(step_id)

    def disconnect(self, drafter_id: str) -> None:
        with self._lock:
            pairing = self._pairings.pop(drafter_id, None)
        if pairing is not None and pairing.receiver is not None:
            try:
                pairing.receiver.close()
            except RuntimeError as err:                   # the peer may already be gone
                logger.debug("closing pairing with %s: %s", drafter_id, err)

    def close(self) -> None:
        for drafter_id in list(self._pairings):
            self.disconnect(drafter_id)
        if self._sockets is not None:
            self._sockets.close()
