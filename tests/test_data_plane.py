"""The data plane delivers each step's drafts bit-exactly, to the right step, or fails loudly."""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
import traceback

import numpy as np
import pytest
import safetensors.numpy
import safetensors.torch
import torch

from concurrency import run_in_processes
from minedraft.data_plane import (HEADER_TAG, DistributedDraftReceiver, DraftPayload, InBandDraftReceiver,
                                  InBandDraftSender, connect_pair, decode_payload,
                                  encode_payload, step_tag)
from minedraft.service.network import free_port

VOCAB = 13
# (step_id, num_tokens); more tokens than fit in the header (INLINE_TOKENS) travel as a
# message of their own: both paths are covered, and the boundary.
STEPS = [(0, 5), (1, 4), (2, 0), (3, 3), (4, 300), (5, 257), (6, 256)]


def make_payload(step_id: int, num_tokens: int, vocab: int = VOCAB) -> DraftPayload:
    """Deterministic per step, so sender and receiver processes build the same tensors."""
    gen = torch.Generator().manual_seed(1000 + step_id)
    return DraftPayload(step_id, torch.randint(0, vocab, (num_tokens,), generator=gen, dtype=torch.int64))


def same_payload(a: DraftPayload, b: DraftPayload) -> bool:
    return (a.step_id == b.step_id and a.token_ids.dtype == b.token_ids.dtype
            and torch.equal(a.token_ids, b.token_ids))


# ---------------------------------------------------------------- in-band

def test_inband_deliver_from_another_thread() -> None:
    receiver = InBandDraftReceiver()
    sender = InBandDraftSender(receiver.deliver)
    expected = make_payload(7, 4)
    thread = threading.Timer(0.05, sender.send, args=(expected,))
    thread.start()
    got = receiver.recv(7, 4, timeout_s=5.0)
    thread.join()
    assert same_payload(got, expected)
    assert sender.bytes_moved == expected.nbytes == 4 * 8      # token ids only: int64 each
    assert receiver.last_bytes == expected.nbytes


def test_inband_out_of_order_steps() -> None:
    receiver = InBandDraftReceiver()
    second, first = make_payload(2, 3), make_payload(1, 2)
    receiver.deliver(second)
    receiver.deliver(first)
    assert same_payload(receiver.recv(1, 2, timeout_s=1.0), first)
    assert same_payload(receiver.recv(2, 3, timeout_s=1.0), second)


def test_inband_timeout_names_step() -> None:
    receiver = InBandDraftReceiver()
    receiver.deliver(make_payload(4, 1))  # another step's drafts must not satisfy it
    with pytest.raises(TimeoutError, match="step 5"):
        receiver.recv(5, 1, timeout_s=0.05)


def test_inband_rejects_mismatched_payload() -> None:
    receiver = InBandDraftReceiver()
    receiver.deliver(make_payload(0, 3))
    with pytest.raises(ValueError, match=r"step 0 expected \(step, tokens\) \(0, 4\), received \(0, 3\)"):
        receiver.recv(0, 4, timeout_s=1.0)


@pytest.mark.parametrize("num_tokens", [6, 0])
def test_encode_decode_roundtrip_is_bit_exact(num_tokens: int) -> None:
    payload = make_payload(2**40 + 3, num_tokens)
    if num_tokens:      # ids whose every byte matters: a byte-order slip cannot pass
        payload.token_ids[0], payload.token_ids[-1] = 2**62 + 2**8 + 1, -2
    fields = encode_payload(payload)
    assert fields["num_tokens"] == num_tokens and fields["step_id"] == 2**40 + 3
    wire = safetensors.numpy.load(fields["draft_token_ids"])     # any safetensors reader reads it
    assert list(wire) == ["draft_token_ids"] and wire["draft_token_ids"].dtype == np.dtype("<i8")
    assert wire["draft_token_ids"].tolist() == payload.token_ids.tolist()
    assert same_payload(decode_payload(**fields), payload)


def test_decode_refuses_a_count_the_bytes_do_not_hold() -> None:
    fields = encode_payload(make_payload(3, 4))
    with pytest.raises(ValueError, match="num_tokens=5 but 4 token ids arrived"):
        decode_payload(**{**fields, "num_tokens": 5})
    with pytest.raises(ValueError, match="step 3: draft token ids are not a safetensors payload"):
        decode_payload(**{**fields, "draft_token_ids": fields["draft_token_ids"][:-1]})
    with pytest.raises(ValueError, match="step 3: draft token ids are not a safetensors payload"):
        decode_payload(**{**fields, "draft_token_ids": np.arange(4, dtype="<i8").tobytes()})   # the old raw bytes


def test_decode_refuses_another_tensor() -> None:
    as_int32 = safetensors.torch.save({"draft_token_ids": torch.arange(4, dtype=torch.int32)})
    with pytest.raises(ValueError, match="step 8: token_ids must be int64"):
        decode_payload(8, as_int32, 4)
    two = safetensors.torch.save({"draft_token_ids": torch.arange(4), "extra": torch.arange(1)})
    with pytest.raises(ValueError, match="step 8: expected the one tensor 'draft_token_ids'"):
        decode_payload(8, two, 4)
    bf16 = safetensors.torch.save({"draft_token_ids": torch.zeros(4, dtype=torch.bfloat16)})
    with pytest.raises(ValueError, match="step 8: draft token ids are not a safetensors payload"):
        decode_payload(8, bf16, 4)
    matrix = safetensors.torch.save({"draft_token_ids": torch.zeros(2, 2, dtype=torch.int64)})
    with pytest.raises(ValueError, match=r"step 8: token_ids must be int64 \[n\]"):
        decode_payload(8, matrix, 4)


def test_step_tag_is_distinct_per_step_and_below_the_header_tag() -> None:
    steps = (0, 1, 2**30 - 1, 2**31 - 2, 2**31 + 5, 2**63 - 1)
    assert all(0 <= step_tag(step) < HEADER_TAG for step in steps)
    assert step_tag(9) != step_tag(10)


# ---------------------------------------------------------------- gloo, two real processes

def _drafter_main(port: int, results: mp.Queue) -> None:
    try:
        torch.set_num_threads(1)
        sender = connect_pair("drafter", "127.0.0.1", port, "gloo", "cpu", connect_timeout_s=20)
        for step_id, num_tokens in STEPS:
            sender.send(make_payload(step_id, num_tokens))
        results.put(("drafter", "ok", sender.bytes_moved))
        sender.close()
    except Exception:
        results.put(("drafter", "error", traceback.format_exc()))


def _verifier_main(port: int, results: mp.Queue) -> None:
    try:
        torch.set_num_threads(1)
        receiver = connect_pair("verifier", "127.0.0.1", port, "gloo", "cpu",
                                connect_timeout_s=20)
        assert isinstance(receiver, DistributedDraftReceiver)
        mismatched = []
        for step_id, num_tokens in STEPS:
            got = receiver.recv(step_id, num_tokens, timeout_s=20)
            if not same_payload(got, make_payload(step_id, num_tokens)):
                mismatched.append(step_id)
        results.put(("verifier", "ok" if not mismatched else f"mismatch {mismatched}",
                     receiver.bytes_moved))
        receiver.close()
    except Exception:
        results.put(("verifier", "error", traceback.format_exc()))


def test_gloo_pair_moves_payloads_bit_exactly() -> None:
    port = free_port()
    reports = {role: (status, detail) for role, status, detail in
               run_in_processes([(_verifier_main, (port,)), (_drafter_main, (port,))], timeout_s=45)}
    expected_bytes = sum(make_payload(*step).nbytes for step in STEPS)
    assert reports["verifier"] == ("ok", expected_bytes), reports
    assert reports["drafter"] == ("ok", expected_bytes), reports


# ---------------------------------------------------------------- the verifier's pairings

def _drafter_then_die(host: str, port: int) -> None:
    import os

    from minedraft.data_plane import DistributedDraftSender

    torch.set_num_threads(1)
    sender = DistributedDraftSender(host, port, connect_timeout_s=20)
    sender.send(make_payload(1, 4))
    os._exit(0)                      # gone without a goodbye, as a killed drafter is


def test_pairing_delivers_then_reports_drafts_lost_with_their_drafter() -> None:
    from minedraft.data_plane import DraftPairings

    pairings = DraftPairings("gloo", "127.0.0.1", "127.0.0.1", connect_timeout_s=20)
    address, _ = pairings.connect("d1")                  # (rendezvous address, pairing key)
    host, _, port = address.rpartition(":")
    proc = mp.get_context("spawn").Process(target=_drafter_then_die, args=(host, int(port)))
    proc.start()
    try:
        got = pairings.recv("d1", 1, 4, timeout_s=30)
        assert got is not None and same_payload(got, make_payload(1, 4))
        proc.join(20)
        assert pairings.recv("d1", 2, 3, timeout_s=30) is None
        assert "d1" not in pairings                       # the dead pairing is dropped
        assert pairings.recv("nobody", 3, 1) is None
    finally:
        pairings.close()
        if proc.is_alive():
            proc.kill()


def test_inband_pairings_keep_drafters_apart() -> None:
    from minedraft.data_plane import DraftPairings

    pairings = DraftPairings("inband", "127.0.0.1", "127.0.0.1")
    (address_a, key_a), (address_b, key_b) = pairings.connect("a"), pairings.connect("b")
    assert address_a == address_b == "" and key_a != key_b       # in-band: nothing to join; keys apart
    pairings.deliver("a", make_payload(5, 2))
    pairings.deliver("b", make_payload(5, 3))                    # same step id, another drafter
    assert same_payload(pairings.recv("b", 5, 3), make_payload(5, 3))
    assert same_payload(pairings.recv("a", 5, 2), make_payload(5, 2))
    with pytest.raises(KeyError, match="drafter_id"):
        pairings.deliver("c", make_payload(6, 1))
    with pytest.raises(ValueError, match="drafter_id"):
        pairings.connect("")


def test_abandoned_drafts_end_the_wait_at_once_and_late_ones_are_dropped() -> None:
    """A verify step sent with its draft call waits at the verifier for the drafts; when the
    draft call fails the gateway abandons them, and the wait ends then, not at its timeout.
    Drafts of that step that come after all are dropped, never left to pile up; the pairing
    stays (its drafter may be fine: only that call failed)."""
    from minedraft.data_plane import DraftPairings

    pairings = DraftPairings("inband", "127.0.0.1", "127.0.0.1")
    pairings.connect("a")
    threading.Timer(0.05, pairings.abandon, args=("a", 3)).start()
    started = time.monotonic()
    assert pairings.recv("a", 3, 2, timeout_s=30) is None
    assert time.monotonic() - started < 5
    assert "a" in pairings
    pairings.deliver("a", make_payload(3, 2))                # late: dropped, not kept
    receiver = pairings._pairings["a"].receiver
    assert not receiver._mailbox.ready
    pairings.deliver("a", make_payload(4, 2))                # arrived, then abandoned: dropped
    pairings.abandon("a", 4)
    assert pairings.recv("a", 4, 2, timeout_s=0.05) is None
    pairings.deliver("a", make_payload(5, 1))                # other steps are untouched
    assert same_payload(pairings.recv("a", 5, 1, timeout_s=1), make_payload(5, 1))
    pairings.abandon("gone", 1)                              # a drafter no longer paired: nothing to do
    assert not DraftPairings("nccl", "127.0.0.1", "127.0.0.1").can_abandon


def _drafter_sends_steps(host: str, port: int, steps: list[int]) -> None:
    from minedraft.data_plane import DistributedDraftSender

    torch.set_num_threads(1)
    sender = DistributedDraftSender(host, port, connect_timeout_s=20)
    for step_id in steps:
        sender.send(make_payload(step_id, 4))
    time.sleep(60)                   # stays up: the verifier's side is under test, not a goodbye


def test_gloo_pairing_abandons_a_step_and_keeps_receiving_the_next() -> None:
    from minedraft.data_plane import DraftPairings

    pairings = DraftPairings("gloo", "127.0.0.1", "127.0.0.1", connect_timeout_s=20)
    address, _ = pairings.connect("d1")
    host, _, port = address.rpartition(":")
    pairings.abandon("d1", 1)                          # before the pairing formed: nothing to drop yet
    proc = mp.get_context("spawn").Process(target=_drafter_sends_steps, args=(host, int(port), [1, 2]))
    proc.start()
    try:
        got = pairings.recv("d1", 1, 4, timeout_s=30)  # not abandoned after all: it formed later
        assert got is not None and same_payload(got, make_payload(1, 4))
        pairings.abandon("d1", 2)
        assert pairings.recv("d1", 2, 4, timeout_s=30) is None
        assert "d1" in pairings
    finally:
        pairings.close()
        if proc.is_alive():
            proc.kill()


def _listening_hosts(port: int) -> set[str]:
    """IPv4 and IPv6 addresses listening on `port`, from /proc/net (LISTEN is state 0A)."""
    hosts = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in open(table).read().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.partition(":")
            if state == "0A" and int(hex_port, 16) == port:
                hosts.add(address)
    return hosts


def test_rendezvous_store_listens_only_where_it_is_told():
    from minedraft.data_plane import listen_store

    store = listen_store("127.0.0.1")
    assert _listening_hosts(store.port) == {"0100007F"}           # 127.0.0.1, little-endian hex
