"""Every row of docs/reliability.md's bad-input table, against real services: the status
code, a message naming the field, and the server serving everyone else afterwards."""

from __future__ import annotations

import math
import time

import grpc
import pytest

from cluster_helpers import assert_idle
from minedraft.launcher import Cluster, ServeConfig
from minedraft.sampling_params import MAX_STOP_LENGTH, MAX_STOP_STRINGS
from minedraft.v1 import engine_pb2, engine_pb2_grpc, generation_pb2, generation_pb2_grpc

MAX_MODEL_LEN = 2048           # the bundled target's context
VOCAB = 4096
INVALID = grpc.StatusCode.INVALID_ARGUMENT


@pytest.fixture(scope="module")
def cluster():
    with Cluster(ServeConfig(mode="psd", k=4, max_batch=4, port=0, drafters=1, max_waiting=4)) as running:
        yield running


@pytest.fixture(scope="module")
def stub(cluster):
    return generation_pb2_grpc.GenerationStub(grpc.insecure_channel(cluster.address))


def _generate(stub, prompt="def add(a, b):", ids=(), request_id="", timeout=60, **sampling):
    request = generation_pb2.GenerateRequest(prompt=prompt, prompt_token_ids=list(ids), request_id=request_id,
                                             sampling=generation_pb2.SamplingOptions(**sampling))
    return stub.Generate(request, timeout=timeout)


def _refused(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


CASES = [
    ("empty prompt", dict(prompt=""), INVALID, "prompt"),
    ("whitespace-only prompt", dict(prompt=" \n\t "), INVALID, "prompt"),
    ("prompt longer than the context", dict(prompt="", ids=[5] * MAX_MODEL_LEN), INVALID, "prompt"),
    ("prompt text beyond any context", dict(prompt="x" * (40 * MAX_MODEL_LEN)), INVALID, "prompt"),
    ("token id outside the vocabulary", dict(prompt="", ids=[1, VOCAB]), INVALID, "prompt_token_ids"),
    ("negative token id", dict(prompt="", ids=[1, -3]), INVALID, "prompt_token_ids"),
    ("negative max_tokens", dict(max_tokens=-1), INVALID, "max_tokens"),
    ("negative temperature", dict(temperature=-0.5), INVALID, "temperature"),
    ("NaN temperature", dict(temperature=math.nan), INVALID, "temperature"),
    ("infinite temperature", dict(temperature=math.inf), INVALID, "temperature"),
    ("top_p above 1", dict(top_p=1.5), INVALID, "top_p"),
    ("negative top_p", dict(top_p=-0.1), INVALID, "top_p"),
    ("NaN top_p", dict(top_p=math.nan), INVALID, "top_p"),
    ("negative top_k", dict(top_k=-1), INVALID, "top_k"),
    ("seed beyond 63 bits", dict(seed=2**63), INVALID, "seed"),
    ("too many stop strings", dict(stop=["s"] * (MAX_STOP_STRINGS + 1)), INVALID, "stop"),
    ("empty stop string", dict(stop=[""]), INVALID, "stop"),
    ("over-long stop string", dict(stop=["s" * (MAX_STOP_LENGTH + 1)]), INVALID, "stop"),
    ("stop token outside the vocabulary", dict(stop_token_ids=[VOCAB + 1]), INVALID, "stop_token_ids"),
]


@pytest.mark.parametrize("fields, code, field", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_field_is_refused_naming_it(stub, fields, code, field):
    error = _refused(lambda: _generate(stub, **fields))
    assert error.code() == code, error.details()
    assert field in error.details()


def test_refused_requests_leave_the_server_serving(stub):
    for _, fields, _, _ in CASES:
        _refused(lambda: _generate(stub, **fields))
    assert len(_generate(stub, max_tokens=8, ignore_eos=True).token_ids) == 8


def test_message_over_the_size_limit_is_refused(stub):
    error = _refused(lambda: _generate(stub, prompt="x" * (5 << 20)))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_malformed_bytes_are_invalid_argument(cluster):
    call = grpc.insecure_channel(cluster.address).unary_unary("/minedraft.v1.Generation/Generate")
    error = _refused(lambda: call(b"\x0a\xff\xff\xff\x0f", timeout=10))
    assert error.code() == INVALID and "request" in error.details()


def test_expired_deadline(stub):
    error = _refused(lambda: _generate(stub, timeout=1e-6))
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED


def test_max_tokens_beyond_the_context_is_clamped_to_it(stub):
    prompt = [5, 6, 7] * ((MAX_MODEL_LEN - 6) // 3)          # leaves 6 positions
    result = _generate(stub, prompt="", ids=prompt, max_tokens=65521, ignore_eos=True)
    assert len(result.token_ids) == MAX_MODEL_LEN - len(prompt) and result.finish_reason == "length"


def test_tiny_temperature_samples_greedily(stub):
    greedy = _generate(stub, max_tokens=12, ignore_eos=True)
    tiny = _generate(stub, max_tokens=12, ignore_eos=True, temperature=1e-38)
    assert list(tiny.token_ids) == list(greedy.token_ids)


def test_client_request_ids_cannot_collide(stub):
    """A client's id is echoed back but never reused inside the server: two requests with the
    same id, or one named like a server-assigned id, are both served."""
    results = [_generate(stub, request_id=rid, max_tokens=4) for rid in ("req-1", "req-1", "mine")]
    assert [r.request_id for r in results] == ["req-1", "req-1", "mine"]
    assert _generate(stub, max_tokens=4).request_id.startswith("req-")


def test_full_queue_answers_resource_exhausted_at_once(cluster, stub):
    """Batches of 2 x 4 plus 4 waiting: the 13th concurrent request is refused at once."""
    calls = [stub.Generate.future(generation_pb2.GenerateRequest(
        prompt="def f(x):", sampling=generation_pb2.SamplingOptions(max_tokens=300, ignore_eos=True)), timeout=120)
        for _ in range(12)]
    deadline = time.monotonic() + 30            # until the 12 have reached the queue (slow hosts)
    while True:
        start = time.monotonic()
        error = _refused(lambda: _generate(stub, max_tokens=4, timeout=5))
        if error.code() != grpc.StatusCode.DEADLINE_EXCEEDED or time.monotonic() > deadline:
            break
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "waiting" in error.details()
    assert time.monotonic() - start < 2.0
    for call in calls:
        call.cancel()


def test_abandoned_streams_free_everything(cluster, stub):
    """Hundreds of streams opened and dropped after their first token: every request's state
    and KV returns on every service."""
    assert_idle(cluster)                       # the tests before may have left cancelled calls
    for _ in range(10):
        # 8 at a time fills both batches; each round waits until the last one's requests are
        # gone from every service, so the fixture's small queue (4) never refuses one.
        streams = [stub.GenerateStream(generation_pb2.GenerateRequest(
            prompt="class Stack:", sampling=generation_pb2.SamplingOptions(max_tokens=200, ignore_eos=True)),
            timeout=60) for _ in range(8)]
        for stream in streams:
            next(stream)
            stream.cancel()
        assert_idle(cluster)
    assert len(_generate(stub, max_tokens=4).token_ids) == 4
    assert_idle(cluster)



# ---- the internal services, called directly (as a hostile client on their port would) -----

def _new(request_id: str, token_ids=(1, 2, 3)) -> engine_pb2.NewRequest:
    return engine_pb2.NewRequest(request_id=request_id, token_ids=list(token_ids),
                                 sampling=generation_pb2.SamplingOptions(max_tokens=4))


def _verifier(cluster):
    return engine_pb2_grpc.VerifierStub(grpc.insecure_channel(cluster.verifier_address))


def _drafter(cluster):
    return engine_pb2_grpc.DrafterStub(grpc.insecure_channel(cluster.drafter_addresses[0]))


STEP_ID = iter(range(10**9, 2 * 10**9))


def test_internal_steps_naming_unknown_requests_are_not_found(cluster):
    verify = _refused(lambda: _verifier(cluster).Step(engine_pb2.VerifyStepRequest(
        step_id=next(STEP_ID), items=[engine_pb2.VerifyItem(request_id="nobody")]), timeout=10))
    assert verify.code() == grpc.StatusCode.NOT_FOUND and "items" in verify.details()
    draft = _refused(lambda: _drafter(cluster).Step(engine_pb2.DraftStepRequest(
        step_id=next(STEP_ID), updates=[engine_pb2.TokenDiff(request_id="nobody", new_token_ids=[1])]), timeout=10))
    assert draft.code() == grpc.StatusCode.NOT_FOUND and "updates" in draft.details()


def test_internal_step_naming_a_drafter_that_never_paired_is_not_found(cluster):
    error = _refused(lambda: _verifier(cluster).Step(engine_pb2.VerifyStepRequest(
        step_id=next(STEP_ID), sources=[engine_pb2.DraftSource(drafter_id="stranger", draft_step_id=1)]), timeout=10))
    assert error.code() == grpc.StatusCode.NOT_FOUND and "sources" in error.details()


def test_internal_duplicate_prefill_and_foreign_tokens_change_nothing(cluster):
    verifier, drafter = _verifier(cluster), _drafter(cluster)
    for stub, message in ((verifier, engine_pb2.VerifyStepRequest), (drafter, engine_pb2.DraftStepRequest)):
        twice = _refused(lambda: stub.Step(message(step_id=next(STEP_ID), new_requests=[_new("x"), _new("x")]),
                                           timeout=10))
        assert twice.code() == INVALID and "already exists" in twice.details()
        foreign = _refused(lambda: stub.Step(message(step_id=next(STEP_ID), new_requests=[_new("y", [1, VOCAB])]),
                                             timeout=10))
        assert foreign.code() == INVALID and "vocabulary" in foreign.details()
    assert_idle(cluster)                       # neither refused step left anything behind


def test_internal_catch_up_that_asks_for_drafts_is_refused_naming_items(cluster):
    drafter = _drafter(cluster)
    refused = _refused(lambda: drafter.Step(engine_pb2.DraftStepRequest(
        step_id=next(STEP_ID), new_requests=[_new("c")], catch_up=True,
        items=[engine_pb2.DraftItem(request_id="c", num_draft=2)]), timeout=10))
    assert refused.code() == INVALID and "items" in refused.details() and "catch_up" in refused.details()
    assert_idle(cluster)                       # the new request was not taken in
    # A catch-up as the gateway sends it takes the tokens in and answers with its busy time.
    answer = drafter.Step(engine_pb2.DraftStepRequest(
        step_id=next(STEP_ID), new_requests=[_new("c")], catch_up=True,
        items=[engine_pb2.DraftItem(request_id="c")]), timeout=10)
    assert answer.busy_s > 0
    drafter.Step(engine_pb2.DraftStepRequest(step_id=next(STEP_ID), finished=["c"]), timeout=10)
    assert_idle(cluster)


def test_pairing_cannot_be_taken_over(cluster):
    drafter_id = _drafter(cluster).GetInfo(engine_pb2.EngineInfoRequest(), timeout=10).drafter_id
    verifier = _verifier(cluster)
    for call in (lambda: verifier.ConnectDrafter(engine_pb2.ConnectDrafterRequest(drafter_id=drafter_id), timeout=10),
                 lambda: verifier.DisconnectDrafter(engine_pb2.DisconnectDrafterRequest(drafter_id=drafter_id),
                                                    timeout=10)):
        assert _refused(call).code() == grpc.StatusCode.PERMISSION_DENIED
    stub = generation_pb2_grpc.GenerationStub(grpc.insecure_channel(cluster.address))
    result = _generate(stub, max_tokens=16, ignore_eos=True)
    assert result.stats.num_drafted > 0                      # drafting still goes on


def test_the_pool_admin_api_is_not_on_the_public_port(cluster):
    public = generation_pb2_grpc.DrafterPoolStub(grpc.insecure_channel(cluster.address))
    error = _refused(lambda: public.List(generation_pb2.ListDraftersRequest(), timeout=10))
    assert error.code() == grpc.StatusCode.UNIMPLEMENTED
    admin = generation_pb2_grpc.DrafterPoolStub(grpc.insecure_channel(cluster.admin_address))
    assert [d.address for d in admin.List(generation_pb2.ListDraftersRequest(), timeout=10).drafters] == \
        cluster.drafter_addresses
    assert cluster.admin_address.startswith("127.0.0.1:")


def test_registering_a_non_drafter_gets_one_uniform_error(cluster):
    admin = generation_pb2_grpc.DrafterPoolStub(grpc.insecure_channel(cluster.admin_address))
    messages = set()
    for address in (cluster.verifier_address, "127.0.0.1:1"):   # another service; a closed port
        error = _refused(lambda: admin.Register(generation_pb2.DrafterEndpoint(address=address), timeout=30))
        assert error.code() == grpc.StatusCode.UNAVAILABLE
        messages.add(error.details().replace(address, "ADDRESS"))
    assert messages == {"address: ADDRESS is not a reachable drafter of this deployment"}
