"""A drafter that catches up on a call of its own (drafting nothing) drafts afterwards exactly
what it would have drafted taking the same tokens in with its first draft, and a catch-up
left behind by rejected drafts or by tokens verified without it is rolled back and redone."""

from __future__ import annotations

import pytest

from minedraft.config import RunnerConfig
from minedraft.drafter import Drafter
from minedraft.model_runner import ModelRunner
from minedraft.sampling_params import SamplingParams

GREEDY = SamplingParams(max_tokens=64)
SAMPLED = SamplingParams(max_tokens=64, temperature=0.8)


def _drafter(path) -> Drafter:
    return Drafter(ModelRunner(RunnerConfig(model_path=str(path), dtype="float32", block_size=4, num_blocks=256)))


@pytest.fixture(scope="module")
def drafters(tiny_checkpoints):
    path = tiny_checkpoints["qwen3"]
    return _drafter(path), _drafter(path)


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_drafts_after_a_catch_up_equal_drafts_that_took_the_tokens_in_themselves(drafters, params):
    caught_up, lazy = drafters
    prompts = {"a": [5, 9, 13, 2, 7, 7, 1], "b": [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]}
    for drafter in drafters:
        for rid, tokens in prompts.items():
            drafter.add_request(rid, tokens, params, seed=11)
    ids = sorted(prompts)
    caught_up.catch_up(ids)
    for rid in ids:                             # everything is in the draft KV now
        assert caught_up.runner.reconcile(rid, prompts[rid]) == len(prompts[rid])
    first = caught_up.draft([(rid, 3) for rid in ids]).draft_token_ids
    assert first == lazy.draft([(rid, 3) for rid in ids]).draft_token_ids
    # The verifier took some drafts and its own next token; meanwhile plain decoding verified
    # more without the drafter: the catch-up rolls back what the verified tokens disagree with.
    verified = {rid: first[i][:1] + [17, 4, 8] for i, rid in enumerate(ids)}
    for drafter in drafters:
        for rid in ids:
            drafter.append_tokens(rid, verified[rid])
    caught_up.catch_up(ids)
    for rid in ids:
        assert caught_up.runner.reconcile(rid, prompts[rid] + verified[rid]) == len(prompts[rid]) + 4
    assert (caught_up.draft([(rid, 2) for rid in ids]).draft_token_ids
            == lazy.draft([(rid, 2) for rid in ids]).draft_token_ids)
    for drafter in drafters:
        for rid in ids:
            drafter.remove_request(rid)


def test_a_catch_up_of_nothing_runs_no_forward(drafters):
    drafter, _ = drafters
    calls = []
    forward = drafter.runner.forward
    drafter.runner.forward = lambda chunks: calls.append(chunks) or forward(chunks)
    try:
        drafter.catch_up([])
    finally:
        drafter.runner.forward = forward
    assert calls == []
