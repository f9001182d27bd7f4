"""A whole deployment with credentials on (API keys and the internal token, from the
environment the services inherit): who is refused, who is served, and that drafting still
works between services that must prove themselves to each other."""

from __future__ import annotations

import grpc
import pytest

from minedraft.client import Client, Unauthenticated
from minedraft.launcher import Cluster, ServeConfig
from minedraft.service.security import API_KEYS_ENV, INTERNAL_TOKEN_ENV
from minedraft.v1 import engine_pb2, engine_pb2_grpc, generation_pb2, generation_pb2_grpc

API_KEY = "test-api-key-0123456789abcdef"
INTERNAL_TOKEN = "test-internal-token-fedcba9876543210"


@pytest.fixture(scope="module")
def cluster():
    with pytest.MonkeyPatch.context() as env:
        env.setenv(API_KEYS_ENV, API_KEY)
        env.setenv(INTERNAL_TOKEN_ENV, INTERNAL_TOKEN)
        with Cluster(ServeConfig(mode="psd", k=4, max_batch=4, port=0, drafters=1)) as running:
            yield running


def _code(call) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code()


def test_public_api_needs_an_api_key(cluster):
    with Client(cluster.address, api_key="") as anonymous:
        with pytest.raises(Unauthenticated):
            anonymous.generate("def f():", max_tokens=4)
    with Client(cluster.address, api_key="wrong-key-wrong-key") as wrong:
        with pytest.raises(Unauthenticated):
            wrong.generate("def f():", max_tokens=4)
    with Client(cluster.address, api_key=API_KEY) as client:
        result = client.generate("def fibonacci(n):", max_tokens=16, ignore_eos=True)
    assert len(result.token_ids) == 16
    assert result.stats.num_drafted > 0          # the drafter proved itself and drafts


def test_internal_services_and_admin_api_refuse_callers_without_the_token(cluster):
    verifier = engine_pb2_grpc.VerifierStub(grpc.insecure_channel(cluster.verifier_address))
    drafter = engine_pb2_grpc.DrafterStub(grpc.insecure_channel(cluster.drafter_addresses[0]))
    admin = generation_pb2_grpc.DrafterPoolStub(grpc.insecure_channel(cluster.admin_address))
    unauthenticated = grpc.StatusCode.UNAUTHENTICATED
    assert _code(lambda: verifier.GetInfo(engine_pb2.EngineInfoRequest(), timeout=10)) == unauthenticated
    assert _code(lambda: verifier.Step(engine_pb2.VerifyStepRequest(step_id=1), timeout=10)) == unauthenticated
    assert _code(lambda: drafter.Step(engine_pb2.DraftStepRequest(step_id=1), timeout=10)) == unauthenticated
    assert _code(lambda: admin.Deregister(generation_pb2.DrafterEndpoint(address=cluster.drafter_addresses[0]),
                                          timeout=10)) == unauthenticated
    token = (("authorization", f"Bearer {INTERNAL_TOKEN}"),)
    info = verifier.GetInfo(engine_pb2.EngineInfoRequest(), metadata=token, timeout=10)
    assert info.num_blocks > 0
    listed = admin.List(generation_pb2.ListDraftersRequest(), metadata=token, timeout=10)
    assert [d.address for d in listed.drafters] == cluster.drafter_addresses
