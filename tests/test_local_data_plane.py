"""The `unix` data plane (a Unix domain socket per pairing): drafts arrive bit-exactly and by
step, only the drafter holding the pairing key gets in, and a drafter that dies or sends
garbage costs its pairing, never the verifier."""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import stat
import struct
import threading
import time

import pytest
import torch

from minedraft.data_plane import DraftPairings, DraftPayload, LocalDraftSender
from minedraft.data_plane.local import MAX_FRAME_TOKENS

# (step_id, num_tokens): the empty step sends nothing; 5000 tokens span several socket reads.
STEPS = [(0, 5), (1, 0), (2, 1), (3, 5000), (2**40 + 7, 3)]


def make_payload(step_id: int, num_tokens: int) -> DraftPayload:
    """Deterministic per step, and ids whose every byte matters (no byte-order slip passes)."""
    gen = torch.Generator().manual_seed(step_id % 2**31)
    return DraftPayload(step_id, torch.randint(-2**62, 2**62, (num_tokens,), generator=gen, dtype=torch.int64))


def same(a: DraftPayload | None, b: DraftPayload) -> bool:
    return a is not None and a.step_id == b.step_id and torch.equal(a.token_ids, b.token_ids)


@pytest.fixture
def pairings():
    pairings = DraftPairings("unix", "127.0.0.1", "127.0.0.1", connect_timeout_s=20)
    yield pairings
    pairings.close()


def _raw_connection(path: str, key: str) -> socket.socket:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(10)
    conn.connect(path)
    conn.sendall(b"MDDP1" + key.encode())
    return conn


def test_payloads_arrive_bit_exactly_whatever_order_they_are_asked_in(pairings):
    path, key = pairings.connect("d1")
    sender = LocalDraftSender(path, key, connect_timeout_s=10)
    for step in STEPS:
        sender.send(make_payload(*step))
    for step in reversed(STEPS):              # a verify step may ask before or after its drafts came
        assert same(pairings.recv("d1", *step, timeout_s=10), make_payload(*step)), step
    moved = sum(make_payload(*step).nbytes for step in STEPS)
    assert sender.bytes_moved == moved == pairings._pairings["d1"].receiver.bytes_moved
    late = threading.Timer(0.1, sender.send, args=(make_payload(9, 2),))   # asked first, sent later
    late.start()
    assert same(pairings.recv("d1", 9, 2, timeout_s=10), make_payload(9, 2))
    sender.close()


def test_a_count_other_than_the_control_messages_drops_the_pairing(pairings):
    path, key = pairings.connect("d1")
    LocalDraftSender(path, key).send(make_payload(4, 3))
    assert pairings.recv("d1", 4, 5, timeout_s=10) is None       # the gateway said 5 drafts
    assert "d1" not in pairings


def test_abandoned_steps_end_the_wait_and_late_drafts_are_dropped(pairings):
    path, key = pairings.connect("d1")
    sender = LocalDraftSender(path, key)
    pairings.recv("d1", 0, 0)                                     # no drafts: nothing waited for
    threading.Timer(0.05, pairings.abandon, args=("d1", 3)).start()
    started = time.monotonic()
    assert pairings.recv("d1", 3, 2, timeout_s=30) is None
    assert time.monotonic() - started < 5
    sender.send(make_payload(3, 2))                               # late: dropped
    sender.send(make_payload(4, 2))
    assert same(pairings.recv("d1", 4, 2, timeout_s=10), make_payload(4, 2))
    assert not pairings._pairings["d1"].receiver._mailbox.ready
    assert "d1" in pairings


def test_only_the_key_holder_gets_in_and_the_socket_is_private(pairings):
    path, key = pairings.connect("d1")
    directory = os.path.dirname(path)
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    wrong = _raw_connection(path, "0" * 32 if key != "0" * 32 else "1" * 32)
    assert wrong.recv(1) == b""                                   # closed unheard
    sender = LocalDraftSender(path, key)
    sender.send(make_payload(1, 4))
    assert same(pairings.recv("d1", 1, 4, timeout_s=10), make_payload(1, 4))
    assert not os.path.exists(path)                               # taken: nobody else can connect
    with pytest.raises(OSError):
        _raw_connection(path, key)
    with pytest.raises(ConnectionError, match="one host"):           # another host's drafter, say
        LocalDraftSender(path, key)
    with pytest.raises(ValueError, match="pairing_key"):
        LocalDraftSender(os.path.join(directory, "none.sock"), "short")
    pairings.close()
    assert not os.path.exists(directory)


@pytest.mark.parametrize("frame", [
    struct.pack("=QI", 7, MAX_FRAME_TOKENS + 1),                  # more drafts than any step carries
    struct.pack("=QI", 7, 0),                                     # an empty step never sends
])
def test_a_corrupt_frame_costs_the_pairing_at_once(pairings, frame):
    path, key = pairings.connect("d1")
    conn = _raw_connection(path, key)
    conn.sendall(frame + struct.pack("=QIq", 8, 1, 5))            # then a good step: too late
    started = time.monotonic()
    assert pairings.recv("d1", 8, 1, timeout_s=10) is None        # refused on its header, not its body
    assert time.monotonic() - started < 5
    assert "d1" not in pairings
    conn.close()
    path, key = pairings.connect("d1")                            # the drafter pairs again
    LocalDraftSender(path, key).send(make_payload(8, 1))
    assert same(pairings.recv("d1", 8, 1, timeout_s=10), make_payload(8, 1))


def test_a_frame_cut_short_by_a_drafter_that_goes_loses_only_that_step(pairings):
    path, key = pairings.connect("d1")
    conn = _raw_connection(path, key)
    conn.sendall(struct.pack("=QI", 7, 3) + b"\x00" * 10)
    conn.close()
    assert pairings.recv("d1", 7, 3, timeout_s=10) is None
    assert "d1" not in pairings


def test_a_drafter_that_never_joins_costs_only_its_pairing():
    pairings = DraftPairings("unix", "127.0.0.1", "127.0.0.1", connect_timeout_s=0.3)
    try:
        pairings.connect("d1")
        assert pairings.recv("d1", 1, 2, timeout_s=5) is None
        assert "d1" not in pairings
    finally:
        pairings.close()


def _send_then_die(path: str, key: str) -> None:
    sender = LocalDraftSender(path, key, connect_timeout_s=20)
    sender.send(make_payload(1, 4))
    os._exit(0)                      # gone without a goodbye, as a killed drafter is


def test_drafts_are_lost_with_a_drafter_process_that_dies(pairings):
    path, key = pairings.connect("d1")
    proc = mp.get_context("spawn").Process(target=_send_then_die, args=(path, key))
    proc.start()
    try:
        assert same(pairings.recv("d1", 1, 4, timeout_s=30), make_payload(1, 4))
        proc.join(20)
        started = time.monotonic()
        assert pairings.recv("d1", 2, 3, timeout_s=30) is None
        assert time.monotonic() - started < 5                     # noticed at once, not at the timeout
        assert "d1" not in pairings
    finally:
        if proc.is_alive():
            proc.kill()
