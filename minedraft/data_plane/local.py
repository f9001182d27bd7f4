"""Same-host transport: a Unix domain socket per pairing, for a drafter and a verifier on one
machine (`minedraft serve` on CPU).

Gloo's transport polls: each pair group's I/O loop wakes every 10 ms on both ends whether or
not drafts move, and on CPU those wake-ups land on the cores the models compute on (the
verifier's, and the drafter's while the verifier borrows them). Here the verifier's receiving
thread sleeps in a blocking read and wakes once per step's drafts, never while nothing moves;
the drafter writes from its send thread. A step's drafts are a few kilobytes at most, so a
socket's copy costs nothing next to the wake-up it saves.

The socket lives in a directory only the verifier's user can enter, and the drafter's first
message is its pairing key (from ConnectDrafter): a connection that does not present it is
closed unheard. Wire format (native byte order: both ends are on one host): a frame is
`step_id` (u64), `num_tokens` (u32), then num_tokens int64 token ids.
"""

from __future__ import annotations

import hmac
import logging
import os
import shutil
import socket
import struct
import tempfile
import time

import torch

from minedraft.data_plane.payload import DraftPayload, MailboxReceiver, _TransferMeter

logger = logging.getLogger("minedraft.data_plane")

_MAGIC = b"MDDP1"
_KEY_BYTES = 32                  # DraftPairings' keys: secrets.token_hex(16)
_FRAME = struct.Struct("=QI")    # step_id, num_tokens
_TOKEN_BYTES = 8
# The most drafts one step may carry: a batch of 4096 requests drafting 64 each. A larger
# count is a corrupt frame, refused before any memory is taken for it.
MAX_FRAME_TOKENS = 1 << 18


class SocketDirectory:
    """A private directory for one verifier's pairing sockets (mode 0700), removed on close."""

    def __init__(self) -> None:
        self.path = tempfile.mkdtemp(prefix="minedraft-dp-")

    def socket_path(self, name: str) -> str:
        return os.path.join(self.path, f"{name}.sock")

    def close(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def listen_socket(path: str) -> socket.socket:
    """The verifier's listening socket for one pairing (it takes one drafter)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path)
        listener.listen(4)
    except OSError:
        listener.close()
        raise
    return listener


def _read_exactly(conn: socket.socket, num_bytes: int) -> bytearray:
    buffer = bytearray(num_bytes)
    view, got = memoryview(buffer), 0
    while got < num_bytes:
        n = conn.recv_into(view[got:])
        if n == 0:
            raise ConnectionError(f"data plane: the drafter closed its socket ({got} of {num_bytes} bytes read)")
        got += n
    return buffer


def _handshake(key: str) -> bytes:
    encoded = key.encode("ascii")
    if len(encoded) != _KEY_BYTES:
        raise ValueError(f"pairing_key: expected {_KEY_BYTES} characters, got {len(encoded)}")
    return _MAGIC + encoded


class LocalDraftReceiver(MailboxReceiver):
    """Verifier end: accepts the one drafter that presents the pairing's key, then its thread
    reads frames as they come. Blocks in the constructor until that drafter joins, and then,
    joined or not, closes the listener and removes its socket: one drafter a socket, nobody
    else gets in."""

    def __init__(self, listener: socket.socket, key: str, device: torch.device | str = "cpu",
                 connect_timeout_s: float = 60.0) -> None:
        super().__init__()
        self.device = torch.device(device)
        path = listener.getsockname()
        try:
            self._conn = self._accept(listener, _handshake(key), connect_timeout_s)
        finally:
            listener.close()
            try:
                os.unlink(path)
            except OSError:
                pass
        self._start_receiving()

    @staticmethod
    def _accept(listener: socket.socket, expected: bytes, timeout_s: float) -> socket.socket:
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"data plane: no drafter presented its pairing key within {timeout_s:.1f}s")
            listener.settimeout(remaining)
            conn, _ = listener.accept()      # socket.timeout (a TimeoutError) past the deadline
            try:
                conn.settimeout(min(remaining, 5.0))
                if hmac.compare_digest(bytes(_read_exactly(conn, len(expected))), expected):
                    conn.settimeout(None)        # from now on the thread waits as long as it takes
                    return conn
                logger.warning("data plane: closed a connection that did not present the pairing key")
            except OSError as err:
                logger.warning("data plane: closed a connection that failed its handshake (%s)", err)
            conn.close()

    def _receive_next(self) -> DraftPayload:
        step_id, num_tokens = _FRAME.unpack(_read_exactly(self._conn, _FRAME.size))
        if not 0 < num_tokens <= MAX_FRAME_TOKENS:
            raise ValueError(f"data plane: step {step_id} announced {num_tokens} draft tokens "
                             f"(at most {MAX_FRAME_TOKENS}, and a step without drafts sends nothing)")
        body = _read_exactly(self._conn, num_tokens * _TOKEN_BYTES)
        return DraftPayload(step_id, torch.frombuffer(body, dtype=torch.int64).to(self.device))

    def close(self) -> None:
        self._mark_closed()
        try:
            self._conn.shutdown(socket.SHUT_RDWR)      # wakes the receiving thread
        except OSError:
            pass                                       # the drafter's end is gone already
        self._conn.close()


class LocalDraftSender(_TransferMeter):
    """Drafter end. `send` returns once the frame is in the socket: the verifier's thread is
    always reading, so that is at once unless the verifier stopped reading altogether."""

    def __init__(self, path: str, key: str, connect_timeout_s: float = 60.0, send_timeout_s: float = 60.0) -> None:
        super().__init__()
        handshake = _handshake(key)
        self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._conn.settimeout(connect_timeout_s)
            try:
                self._conn.connect(path)
            except (FileNotFoundError, ConnectionRefusedError) as err:
                raise ConnectionError(f"data plane unix: cannot reach the verifier's socket {path} ({err}); "
                                      f"drafter and verifier must run on one host and see one /tmp "
                                      f"(else start the verifier with --data-plane gloo)") from err
            self._conn.sendall(handshake)
            self._conn.settimeout(send_timeout_s)
        except OSError:
            self._conn.close()
            raise

    def send(self, payload: DraftPayload) -> None:
        if payload.num_tokens == 0:
            return
        token_ids = payload.token_ids.detach().to("cpu", torch.int64).contiguous()
        self._conn.sendall(_FRAME.pack(payload.step_id, payload.num_tokens) + token_ids.numpy().tobytes())
        self._record(payload.nbytes)

    def close(self) -> None:
        self._conn.close()
