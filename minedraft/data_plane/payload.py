"""What one drafter step moves, the two ends' interface, and the tags it travels under."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol

import torch

VERIFIER_RANK = 0
DRAFTER_RANK = 1
_TAG_SPACE = 2**31  # process-group tags are non-negative int32
ABANDONED_KEPT = 1024  # abandoned steps remembered, so drafts that arrive after all are dropped


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
    """Verifier side of the data plane; the control message supplies every size.
    last_wait_s: how long the last `recv` waited for drafts not there yet (the verify went
    out with its draft call), apart from taking them in."""

    last_wait_s: float

    def recv(self, step_id: int, num_tokens: int, timeout_s: float = 60.0) -> DraftPayload: ...

    def abandon(self, step_id: int) -> None: ...

    def close(self) -> None: ...


class DraftsAbandoned(Exception):
    """The step's drafts will not come (the gateway's call for them failed): no wait, no
    error of the pairing."""


class Mailbox:
    """Payloads that arrived, keyed by step id, until a verify step takes them; and the steps
    whose drafts were abandoned. Callers hold their own lock around every method."""

    def __init__(self) -> None:
        self.ready: dict[int, DraftPayload] = {}
        self._arrived: dict[int, float] = {}        # when each ready payload came (perf_counter)
        self._abandoned: OrderedDict[int, None] = OrderedDict()

    def put(self, payload: DraftPayload) -> bool:
        """-> False when the step was abandoned (the payload is dropped)."""
        if payload.step_id in self._abandoned:
            del self._abandoned[payload.step_id]
            return False
        self.ready[payload.step_id] = payload
        self._arrived[payload.step_id] = time.perf_counter()
        return True

    def abandon(self, step_id: int) -> None:
        """Drop the step's payload if it came, and any that comes later."""
        self.ready.pop(step_id, None)
        self._arrived.pop(step_id, None)
        self._abandoned[step_id] = None
        while len(self._abandoned) > ABANDONED_KEPT:
            self._abandoned.popitem(last=False)

    def settled(self, step_id: int) -> bool:
        """Its payload is here, or it will not come."""
        return step_id in self.ready or step_id in self._abandoned

    def take(self, step_id: int) -> tuple[DraftPayload, float]:
        """(the payload, when it came) once `settled`; raises DraftsAbandoned when it will
        not come."""
        payload = self.ready.pop(step_id, None)
        if payload is None:
            raise DraftsAbandoned(f"data plane: the drafts of step {step_id} were abandoned")
        return payload, self._arrived.pop(step_id)


class _TransferMeter:
    """Bytes moved in all and in the last transfer (the drafter reports the latter per step)."""

    def __init__(self) -> None:
        self.bytes_moved = 0
        self.last_bytes = 0
        self.last_wait_s = 0.0

    def _record(self, nbytes: int) -> None:
        self.bytes_moved += nbytes
        self.last_bytes = nbytes


class MailboxReceiver(_TransferMeter):
    """A receiver whose payloads wait in a mailbox, keyed by step id, until a verify step
    takes them (`_take`), so a drafter's send never waits on the verifier's step loop. They
    are put there by a thread of its own (`_start_receiving`, over the subclass's blocking
    `_receive_next`, which raises once the peer is gone or the end is closed) or by another
    caller (`_put`)."""

    device = torch.device("cpu")            # where payloads arrive (ends on a GPU set their own)

    def __init__(self) -> None:
        _TransferMeter.__init__(self)       # explicitly: subclasses mix in other ends
        self._mailbox = Mailbox()
        self._error: BaseException | None = None
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None

    def _receive_next(self) -> DraftPayload:
        raise NotImplementedError

    def _start_receiving(self) -> None:
        self._thread = threading.Thread(target=self._receive_forever, name="draft-recv", daemon=True)
        self._thread.start()

    def _receive_forever(self) -> None:
        while not self._closed:
            try:
                self._put(self._receive_next())
            except BaseException as err:       # closed; the peer went away or sent a step twice
                with self._cond:
                    self._error = None if self._closed else err
                    self._cond.notify_all()
                return

    def _put(self, payload: DraftPayload) -> None:
        with self._cond:
            if self._closed:
                raise RuntimeError(f"data plane closed; dropping drafts for step {payload.step_id}")
            if payload.step_id in self._mailbox.ready:
                raise ValueError(f"drafts for step {payload.step_id} delivered twice")
            if self._mailbox.put(payload):
                self._cond.notify_all()

    def _take(self, step_id: int, timeout_s: float) -> DraftPayload:
        """The step's payload once it came; sets last_wait_s."""
        start = time.perf_counter()
        with self._cond:
            arrived = self._cond.wait_for(
                lambda: self._mailbox.settled(step_id) or self._error is not None or self._closed, timeout_s)
            if not self._mailbox.settled(step_id):      # drafts that came before a failure still count
                if self._error is not None:
                    raise RuntimeError(f"data plane: receiving failed before step {step_id}") from self._error
                if self._closed:
                    raise RuntimeError(f"data plane closed while waiting for step {step_id}")
                if not arrived:
                    raise TimeoutError(f"data plane: no drafts for step {step_id} after {timeout_s:.1f}s")
            payload, arrived_at = self._mailbox.take(step_id)
        self.last_wait_s = max(0.0, arrived_at - start)
        return payload

    def recv(self, step_id: int, num_tokens: int, timeout_s: float = 60.0) -> DraftPayload:
        """The step's drafts, held to what its control message promised (a step with none
        waits for nothing)."""
        self.last_wait_s = 0.0
        if num_tokens == 0:
            return empty_payload(step_id, self.device)
        payload = check_payload(self._take(step_id, timeout_s), step_id, num_tokens)
        self._record(payload.nbytes)
        return payload

    def abandon(self, step_id: int) -> None:
        with self._cond:
            self._mailbox.abandon(step_id)
            self._cond.notify_all()

    def _mark_closed(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


def check_payload(payload: DraftPayload, step_id: int, num_tokens: int) -> DraftPayload:
    """Hold a payload to what the control message promised."""
    expected, got = (step_id, num_tokens), (payload.step_id, payload.num_tokens)
    if got != expected:
        raise ValueError(f"data plane: step {step_id} expected (step, tokens) {expected}, received {got}")
    return payload


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
