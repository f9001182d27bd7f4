"""Auto mode on real processes: switching layout and draft lengths at step boundaries loses
nothing. The switches are forced (the gateway's test-only --auto-cycle-steps rotates ar, sd and
psd every few steps and gives requests varied draft lengths), so they certainly happen while
requests are in flight, at every concurrency."""

from __future__ import annotations

from collections import Counter

import pytest

from cluster_helpers import MAX_TOKENS, assert_idle, generate_all, request
from minedraft import bundled
from minedraft.client import Client
from minedraft.constants import LAYOUTS
from minedraft.launcher import Cluster, ServeConfig
from reference import DRAFT, TARGET, assert_matches_reference, greedy_reference

K_MAX = 4


def _config(**overrides) -> ServeConfig:
    return ServeConfig(**{**dict(mode="auto", k=K_MAX, max_batch=32, port=0, target=TARGET, draft=DRAFT,
                                 num_blocks=1024), **overrides})


@pytest.fixture(scope="module")
def switching():
    with Cluster(_config(auto_cycle_steps=3)) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def planning():
    with Cluster(_config()) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def prompts() -> list[str]:
    return bundled.load_prompts(32)


@pytest.fixture(scope="module")
def reference(prompts):
    return greedy_reference(prompts, MAX_TOKENS)


def _steps(cluster: Cluster) -> list[dict]:
    with Client(cluster.address, timeout=30) as client:
        return client.step_stats()


@pytest.mark.parametrize("concurrency", [1, 8, 32])
def test_greedy_output_equals_reference_while_the_layout_switches(switching, prompts, reference, concurrency):
    llm, expected = reference
    seen = len(_steps(switching))
    responses = generate_all(switching, [request(p) for p in prompts], concurrency=concurrency)
    assert all(len(r.token_ids) == MAX_TOKENS and r.finish_reason == "length" for r in responses)
    assert_matches_reference(llm, prompts, expected, [list(r.token_ids) for r in responses],
                             f"auto (forced switches) C={concurrency}")
    steps = _steps(switching)[seen:]
    layouts = Counter(s["layout"] for s in steps if s["kind"] == "verify")
    assert set(layouts) >= ({"ar", "sd"} if concurrency == 1 else set(LAYOUTS)), layouts
    drafted = Counter(k for s in steps if s["kind"] == "verify" for k in s["draft_lengths"])
    assert len(drafted) >= 3, drafted               # per-request draft lengths really vary
    assert sum(r.stats.num_accepted for r in responses) > 0
    # On the way from plain decoding to drafting the drafter caught up on calls of its own
    # (drafting nothing) while plain steps went on.
    catch_ups = [s for s in steps if s["kind"] == "draft" and not any(s["draft_lengths"])]
    assert catch_ups and all(s["draft_busy_s"] > 0 for s in catch_ups)
    assert any(v["kind"] == "verify" and not any(v["draft_lengths"])
               and c["start_s"] < v["start_s"] < c["start_s"] + c["wall_s"] for c in catch_ups for v in steps)
    assert_idle(switching)


def test_seeded_sampling_is_reproducible_across_switches(switching, prompts):
    requests = [request(p, temperature=t, top_p=tp, seed=s, max_tokens=16)
                for p, (t, tp, s) in zip(prompts[:6], [(1.0, 1.0, 1), (0.7, 1.0, 2), (1.0, 0.8, 3)] * 2)]
    first = [list(r.token_ids) for r in generate_all(switching, requests, concurrency=6)]
    again = [list(r.token_ids) for r in generate_all(switching, requests, concurrency=2)]
    assert first == again
    # Drafts never change a sampled token (coupled verification): plain decoding's output.
    with Cluster(_config(mode="ar", k=0, drafters=0)) as ar:
        assert first == [list(r.token_ids) for r in generate_all(ar, requests)]


def test_speculation_off_and_capped_requests_are_honoured_in_auto_mode(switching, prompts):
    off, capped = generate_all(switching, [request(prompts[0], max_draft=0), request(prompts[1], max_draft=1)])
    assert off.stats.num_drafted == 0
    assert capped.stats.num_drafted > 0 and len(capped.stats.drafted_at) == 1


def test_the_plan_and_the_cost_model_are_visible(planning, prompts, reference):
    llm, expected = reference
    responses = generate_all(planning, [request(p) for p in prompts[:16]], concurrency=8)
    assert_matches_reference(llm, prompts[:16], expected[:16], [list(r.token_ids) for r in responses], "auto")
    with Client(planning.address, timeout=30) as client:
        info = client.server_info()
    assert info["mode"] == "auto" and info["k"] == K_MAX
    model, plan = info["cost_model"], info["plan"]
    assert model["verify_calls"] > 0 and model["verify_fixed_s"] + model["verify_per_token_s"] > 0
    assert plan["layout"] in LAYOUTS and plan["replans"] > 0
    assert set(plan["layout_tokens_per_s"]) <= set(LAYOUTS) and plan["layout_tokens_per_s"]
    assert len(plan["acceptance_reach"]) == K_MAX
    assert 4.0 <= plan["acceptance_prior_strength"] <= 64.0
    # The spread is a variance of rates in [0, 1] (0.25 at most), 0 only where requests are
    # alike, and then the prior is at its strongest.
    spread = plan.get("acceptance_spread", 0.0)
    assert 0.0 <= spread <= 0.25 and (spread > 0 or plan["acceptance_prior_strength"] == 64.0)
    for slowdowns in (plan["layout_slowdown"], plan["layout_prefill_slowdown"]):
        assert set(slowdowns) == set(LAYOUTS) and all(0.5 <= v <= 3.0 for v in slowdowns.values())
    delivered = plan.get("layout_delivered_tokens_per_s", {})     # (where measured 1 s at the load)
    assert set(delivered) <= set(LAYOUTS) and all(v > 0 for v in delivered.values())
    assert model["prompt_per_output"] > 0                        # 16 prompts of several tokens each
    assert 0 < model.get("data_plane_per_call_s", 0) < 0.1        # the profile's drafting steps at least
    steps = _steps(planning)
    assert any(s["layout"] == "profile" for s in steps)           # the start-up profile ran
    verifies = [s for s in steps if s["kind"] == "verify" and s["layout"] != "profile"]
    assert all(s["layout"] in LAYOUTS and len(s["draft_lengths"]) == s["verify_batch"] for s in verifies)
    assert sum(s["predicted_busy_s"] > 0 for s in verifies) > len(verifies) // 2
    assert_idle(planning)
