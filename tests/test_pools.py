"""Drafter pools as real processes: requests spread over the drafters, a drafter added
mid-run takes new requests, and a drafter killed mid-run loses nothing."""

from __future__ import annotations

import threading
import time
from functools import partial

import grpc
import pytest

from cluster_helpers import MAX_TOKENS, assert_idle, generate_all, request, stub
from concurrency import run_concurrently
from drafter_svc.membership import CHECK_INTERVAL_S
from minedraft import bundled
from minedraft.launcher import Cluster, ServeConfig
from minedraft.llm import LLM
from minedraft.v1 import generation_pb2, generation_pb2_grpc
from reference import DRAFT, TARGET, assert_matches_reference, greedy_reference

LONG = 48     # tokens per request in the kill test: long enough to kill mid-run


@pytest.fixture(scope="module")
def prompts() -> list[str]:
    return bundled.load_prompts(16)


@pytest.fixture(scope="module")
def reference(prompts):
    return greedy_reference(prompts, LONG)


def _config(**overrides) -> ServeConfig:
    return ServeConfig(**{"mode": "psd", "k": 3, "max_batch": 4, "port": 0, "target": TARGET, "draft": DRAFT,
                          "num_blocks": 1024, **overrides})


def _admin(cluster: Cluster) -> generation_pb2_grpc.DrafterPoolStub:
    """The gateway's drafter-pool admin API (its own port, not the public one)."""
    return generation_pb2_grpc.DrafterPoolStub(grpc.insecure_channel(cluster.admin_address))


def _pool(cluster: Cluster) -> dict[str, generation_pb2.DrafterStatus]:
    status = _admin(cluster).List(generation_pb2.ListDraftersRequest(), timeout=10)
    return {d.address: d for d in status.drafters}


def _assert_reference(llm: LLM, prompts, expected, responses, max_tokens: int) -> None:
    """Every response ran to `max_tokens`, and its greedy tokens equal the reference's first
    `max_tokens` up to a float near-tie (at most one)."""
    for resp in responses:
        assert len(resp.token_ids) == max_tokens and resp.finish_reason == "length", (
            len(resp.token_ids), resp.finish_reason)
    assert_matches_reference(llm, prompts, [exp[:max_tokens] for exp in expected],
                             [list(resp.token_ids) for resp in responses], f"max_tokens={max_tokens}")


@pytest.mark.parametrize("mode", ["sd", "psd"])
def test_two_drafters_share_requests_and_match_reference(prompts, reference, mode):
    llm, expected = reference
    with Cluster(_config(mode=mode, drafters=2)) as cluster:
        assert len(cluster.drafter_addresses) == 2
        responses = generate_all(cluster, [request(p) for p in prompts])
        _assert_reference(llm, prompts, expected, responses, MAX_TOKENS)
        assigned = {a: d.requests_assigned for a, d in _pool(cluster).items()}
        assert sorted(assigned) == sorted(cluster.drafter_addresses)
        assert all(n >= 4 for n in assigned.values()), assigned        # least-loaded placement spreads them
        assert sum(r.stats.num_accepted for r in responses) > 0
        assert_idle(cluster)


def test_drafter_added_mid_run_takes_new_requests(prompts, reference):
    llm, expected = reference
    with Cluster(_config(drafters=1)) as cluster:
        first = generate_all(cluster, [request(p) for p in prompts[:4]])
        _assert_reference(llm, prompts[:4], expected[:4], first, MAX_TOKENS)
        name, address = cluster.add_drafter()
        assert _pool(cluster)[address].requests_assigned == 0
        responses = generate_all(cluster, [request(p) for p in prompts])
        _assert_reference(llm, prompts, expected, responses, MAX_TOKENS)
        pool = _pool(cluster)
        assert pool[address].requests_assigned > 0, pool
        assert_idle(cluster)
        # A drafter that leaves the pool gracefully takes no more requests; the rest go on.
        admin = _admin(cluster)
        admin.Deregister(generation_pb2.DrafterEndpoint(address=address), timeout=10)
        assert address not in _pool(cluster)
        again = generate_all(cluster, [request(p) for p in prompts[:4]])
        _assert_reference(llm, prompts[:4], expected[:4], again, MAX_TOKENS)
        time.sleep(CHECK_INTERVAL_S + 1)       # a dismissed drafter does not rejoin by itself
        assert address not in _pool(cluster)
        with pytest.raises(grpc.RpcError) as err:
            admin.Deregister(generation_pb2.DrafterEndpoint(address=address), timeout=10)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND and "address" in err.value.details()


def test_register_rejects_bad_drafters(prompts):
    with Cluster(_config(drafters=1)) as cluster:
        pool = _admin(cluster)
        with pytest.raises(grpc.RpcError) as err:
            pool.Register(generation_pb2.DrafterEndpoint(address="not-an-address"), timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "address" in err.value.details()
        # The verifier answers health checks but is no drafter: refused, pool unchanged.
        with pytest.raises(grpc.RpcError):
            pool.Register(generation_pb2.DrafterEndpoint(address=cluster.verifier_address), timeout=60)
        assert list(_pool(cluster)) == cluster.drafter_addresses
        response = generate_all(cluster, [request(prompts[0], max_tokens=4)])[0]
        assert len(response.token_ids) == 4


def test_killed_drafters_lose_nothing(prompts, reference):
    """Kill one drafter mid-run (its requests move to the other), then the last one (the
    rest finish at k = 0 on the verifier): every stream is complete, in order, and exact."""
    llm, expected = reference
    with Cluster(_config(drafters=2)) as cluster:
        public = stub(cluster)
        streamed: list[list[int]] = [[] for _ in prompts]
        finals: list[generation_pb2.GenerateStreamResponse | None] = [None] * len(prompts)
        progress = threading.Condition()

        def consume(i: int) -> None:
            for chunk in public.GenerateStream(request(prompts[i], max_tokens=LONG), timeout=600):
                with progress:
                    streamed[i].extend(chunk.token_ids)
                    progress.notify_all()
                if chunk.finish_reason:
                    finals[i] = chunk

        def wait_for_tokens(total: int) -> None:
            with progress:
                assert progress.wait_for(lambda: sum(map(len, streamed)) >= total, timeout=300)

        def kill_both_drafters() -> None:
            wait_for_tokens(len(prompts) * 4)
            cluster.kill("drafter-0")
            wait_for_tokens(len(prompts) * LONG // 2)
            cluster.kill("drafter-1")

        run_concurrently([partial(consume, i) for i in range(len(prompts))], while_running=kill_both_drafters)
        assert all(f is not None and f.finish_reason == "length" for f in finals)
        assert all(len(tokens) == LONG for tokens in streamed), [len(tokens) for tokens in streamed]
        assert_matches_reference(llm, prompts, expected, streamed, "streamed across both kills")
        assert _pool(cluster) == {}
        # With no drafter left the gateway keeps serving at k = 0.
        after = generate_all(cluster, [request(p, max_tokens=8) for p in prompts[:2]])
        _assert_reference(llm, prompts[:2], expected[:2], after, 8)
        assert all(r.stats.num_drafted == 0 for r in after)
        assert_idle(cluster, drafters=[])
        assert not cluster.dead()
