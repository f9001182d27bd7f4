"""The data plane delivers each step's drafts bit-exactly, to the right step, or fails loudly."""

from __future__ import annotations

import multiprocessing as mp
import threading
import traceback

import pytest
import torch

from concurrency import run_in_processes
from minedraft.data_plane import (DistributedDraftReceiver, DraftPayload, InBandDraftReceiver,
                                  InBandDraftSender, connect_pair, decode_payload,
                                  encode_payload, step_tags)
from minedraft.service.network import free_port

VOCAB = 13
# (step_id, num_tokens, probs dtype or None for a greedy drafter); more tokens than fit in
# the header (INLINE_TOKENS) travel as a message of their own: both paths are covered.
STEPS = [(0, 5, torch.float32), (1, 4, None), (2, 0, torch.bfloat16), (3, 3, torch.bfloat16),
         (4, 300, None), (5, 257, torch.float32), (6, 256, None)]


def make_payload(step_id: int, num_tokens: int, dtype: torch.dtype | None,
                 vocab: int = VOCAB) -> DraftPayload:
    """Deterministic per step, so sender and receiver processes build the same tensors."""
    gen = torch.Generator().manual_seed(1000 + step_id)
    token_ids = torch.randint(0, vocab, (num_tokens,), generator=gen, dtype=torch.int64)
    probs = None
    if dtype is not None:
        probs = torch.rand(num_tokens, vocab, generator=gen).softmax(-1).to(dtype)
    return DraftPayload(step_id, token_ids, probs)


def same_bits(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    as_int = {8: torch.int64, 4: torch.int32, 2: torch.int16}[a.element_size()]
    return torch.equal(a.contiguous().view(as_int), b.contiguous().view(as_int))


def same_payload(a: DraftPayload, b: DraftPayload) -> bool:
    return (a.step_id == b.step_id and same_bits(a.token_ids, b.token_ids)
            and same_bits(a.probs, b.probs))


# ---------------------------------------------------------------- in-band

def test_inband_deliver_from_another_thread() -> None:
    receiver = InBandDraftReceiver()
    sender = InBandDraftSender(receiver.deliver)
    expected = make_payload(7, 4, torch.float32)
    thread = threading.Timer(0.05, sender.send, args=(expected,))
    thread.start()
    got = receiver.recv(7, 4, True, VOCAB, torch.float32, timeout_s=5.0)
    thread.join()
    assert same_payload(got, expected)
    assert sender.bytes_moved == expected.nbytes == 4 * 8 + 4 * VOCAB * 4
    assert receiver.last_bytes == expected.nbytes


def test_inband_out_of_order_steps() -> None:
    receiver = InBandDraftReceiver()
    second, first = make_payload(2, 3, None), make_payload(1, 2, torch.bfloat16)
    receiver.deliver(second)
    receiver.deliver(first)
    assert same_payload(receiver.recv(1, 2, True, VOCAB, torch.bfloat16, timeout_s=1.0), first)
    assert same_payload(receiver.recv(2, 3, False, VOCAB, torch.float32, timeout_s=1.0), second)


def test_inband_timeout_names_step() -> None:
    receiver = InBandDraftReceiver()
    receiver.deliver(make_payload(4, 1, None))  # another step's drafts must not satisfy it
    with pytest.raises(TimeoutError, match="step 5"):
        receiver.recv(5, 1, False, VOCAB, torch.float32, timeout_s=0.05)


def test_inband_rejects_mismatched_payload() -> None:
    receiver = InBandDraftReceiver()
    receiver.deliver(make_payload(0, 3, torch.float32))
    with pytest.raises(ValueError, match="expected 4 draft tokens"):
        receiver.recv(0, 4, True, VOCAB, torch.float32, timeout_s=1.0)
    receiver.deliver(make_payload(1, 3, torch.float32))
    with pytest.raises(ValueError, match="bfloat16"):
        receiver.recv(1, 3, True, VOCAB, torch.bfloat16, timeout_s=1.0)
    receiver.deliver(make_payload(2, 3, torch.float32, vocab=VOCAB + 1))
    with pytest.raises(ValueError, match="step 2"):
        receiver.recv(2, 3, True, VOCAB, torch.float32, timeout_s=1.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, None])
def test_encode_decode_roundtrip_is_bit_exact(dtype: torch.dtype | None) -> None:
    payload = make_payload(2**40 + 3, 6, dtype)
    fields = encode_payload(payload)
    assert fields["num_tokens"] == 6 and fields["step_id"] == 2**40 + 3
    assert (fields["draft_probs"] == b"") == (dtype is None)
    assert same_payload(decode_payload(**fields), payload)


def test_step_tags_are_distinct_and_in_range() -> None:
    tags = [tag for step in (0, 1, 2**30 - 1, 2**31 + 5, 2**63 - 1) for tag in step_tags(step)]
    assert all(0 <= tag < 2**31 for tag in tags)
    assert len(set(step_tags(9))) == 2 and set(step_tags(9)).isdisjoint(step_tags(10))


# ---------------------------------------------------------------- gloo, two real processes

def _drafter_main(port: int, results: mp.Queue) -> None:
    try:
        torch.set_num_threads(1)
        sender = connect_pair("drafter", "127.0.0.1", port, "gloo", "cpu", connect_timeout_s=20)
        for step_id, num_tokens, dtype in STEPS:
            sender.send(make_payload(step_id, num_tokens, dtype))
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
        for step_id, num_tokens, dtype in STEPS:
            got = receiver.recv(step_id, num_tokens, dtype is not None, VOCAB,
                                dtype or torch.float32, timeout_s=20)
            if not same_payload(got, make_payload(step_id, num_tokens, dtype)):
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
    sender.send(make_payload(1, 4, None))
    os._exit(0)                      # gone without a goodbye, as a killed drafter is


def test_pairing_delivers_then_reports_drafts_lost_with_their_drafter() -> None:
    from minedraft.data_plane import DraftPairings

    pairings = DraftPairings("gloo", "127.0.0.1", "127.0.0.1", connect_timeout_s=20)
    address, _ = pairings.connect("d1")                  # (rendezvous address, pairing key)
    host, _, port = address.rpartition(":")
    proc = mp.get_context("spawn").Process(target=_drafter_then_die, args=(host, int(port)))
    proc.start()
    try:
        got = pairings.recv("d1", 1, 4, False, VOCAB, torch.float32, timeout_s=30)
        assert got is not None and same_payload(got, make_payload(1, 4, None))
        proc.join(20)
        assert pairings.recv("d1", 2, 3, False, VOCAB, torch.float32, timeout_s=30) is None
        assert "d1" not in pairings                       # the dead pairing is dropped
        assert pairings.recv("nobody", 3, 1, False, VOCAB, torch.float32) is None
    finally:
        pairings.close()
        if proc.is_alive():
            proc.kill()


def test_inband_pairings_keep_drafters_apart() -> None:
    from minedraft.data_plane import DraftPairings

    pairings = DraftPairings("inband", "127.0.0.1", "127.0.0.1")
    (address_a, key_a), (address_b, key_b) = pairings.connect("a"), pairings.connect("b")
    assert address_a == address_b == "" and key_a != key_b       # in-band: nothing to join; keys apart
    pairings.deliver("a", make_payload(5, 2, None))
    pairings.deliver("b", make_payload(5, 3, torch.float32))     # same step id, another drafter
    assert same_payload(pairings.recv("b", 5, 3, True, VOCAB, torch.float32), make_payload(5, 3, torch.float32))
    assert same_payload(pairings.recv("a", 5, 2, False, VOCAB, torch.float32), make_payload(5, 2, None))
    with pytest.raises(KeyError, match="drafter_id"):
        pairings.deliver("c", make_payload(6, 1, None))
    with pytest.raises(ValueError, match="drafter_id"):
        pairings.connect("")


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
