"""In-process generation: speculative decoding is lossless and reproducible."""

from __future__ import annotations

import itertools

import pytest

from minedraft import bundled
from minedraft.llm import LLM
from minedraft.sampling_params import SamplingParams
from reference import DRAFT, TARGET, assert_matches_reference


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(TARGET, DRAFT, dtype="float32")


@pytest.fixture(scope="module")
def prompts() -> list[str]:
    return bundled.load_prompts(32)


@pytest.fixture(scope="module")
def greedy_reference(llm, prompts):
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    return params, [o.token_ids for o in llm.generate(prompts, params, mode="ar", max_batch=8)]


@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_greedy_sd_equals_ar(llm, prompts, greedy_reference, batch, k):
    params, expected = greedy_reference
    outputs = llm.generate(prompts, params, mode="sd", k=k, max_batch=batch)
    assert all(len(out.token_ids) == params.max_tokens for out in outputs), [len(o.token_ids) for o in outputs]
    assert_matches_reference(llm, prompts, expected, [out.token_ids for out in outputs], f"sd k={k} batch={batch}")
    assert outputs[0].stats.num_steps > 0


def test_greedy_ar_batch_independent(llm, prompts, greedy_reference):
    params, expected = greedy_reference
    outputs = llm.generate(prompts[:6], params, mode="ar", max_batch=1)
    assert [o.token_ids for o in outputs] == expected[:6]


@pytest.mark.parametrize("mode,k", [("ar", 0), ("sd", 3)])
def test_seeded_sampling_is_reproducible(llm, prompts, mode, k):
    params = [SamplingParams(max_tokens=20, temperature=t, top_p=p, seed=s, ignore_eos=True)
              for t, p, s in [(1.0, 1.0, 1), (0.7, 1.0, 2), (1.0, 0.8, 3), (0.7, 0.9, 4)]]
    first = llm.generate(prompts[:4], params, mode=mode, k=k, max_batch=4)
    again = llm.generate(prompts[:4], params, mode=mode, k=k, max_batch=2)
    assert [o.token_ids for o in first] == [o.token_ids for o in again]
    other = [SamplingParams(max_tokens=20, temperature=1.0, seed=99, ignore_eos=True)] * 4
    different = llm.generate(prompts[:4], other, mode=mode, k=k, max_batch=4)
    assert [o.token_ids for o in different] != [o.token_ids for o in first]


@pytest.fixture(scope="module")
def sampled_reference(llm, prompts):
    params = [SamplingParams(max_tokens=24, temperature=t, top_p=p, top_k=top_k, seed=50 + i, ignore_eos=True)
              for i, (t, p, top_k) in enumerate([(1.0, 1.0, 0), (0.7, 1.0, 0), (1.0, 0.8, 0), (0.7, 0.9, 20)] * 2)]
    return params, [o.token_ids for o in llm.generate(prompts[:8], params, mode="ar", max_batch=8)]


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_sampled_sd_equals_ar_token_for_token(llm, prompts, sampled_reference, k):
    """Coupled verification: a seeded sampled request emits plain decoding's tokens whatever k."""
    params, expected = sampled_reference
    outputs = llm.generate(prompts[:8], params, mode="sd", k=k, max_batch=8)
    assert [o.token_ids for o in outputs] == expected
    assert sum(o.stats.num_accepted for o in outputs) > 0


def test_sampled_output_does_not_depend_on_a_changing_k(llm, prompts, sampled_reference, monkeypatch):
    """k changing every step (as the gateway's auto mode does from timings) changes nothing."""
    params, expected = sampled_reference
    schedule = itertools.cycle([3, 1, 5, 2, 4])
    step = llm._step
    monkeypatch.setattr(llm, "_step", lambda running, k: step(running, next(schedule)))
    outputs = llm.generate(prompts[:8], params, mode="sd", k=4, max_batch=3)
    assert [o.token_ids for o in outputs] == expected


def test_drafter_races_on_the_verifiers_noise(prompts):
    """With the target as its own drafter, every sampled draft is the target's own sample and
    is accepted: drafter and verifier key the same noise to the same positions."""
    same = LLM(TARGET, TARGET, dtype="float32")
    params = [SamplingParams(max_tokens=16, temperature=t, top_p=p, seed=7 + i, ignore_eos=True)
              for i, (t, p) in enumerate([(1.0, 1.0), (0.7, 0.9)])]
    outputs = same.generate(prompts[:2], params, mode="sd", k=4, max_batch=2)
    assert all(o.stats.num_accepted == o.stats.num_drafted > 0 for o in outputs)


def test_preemption_when_cache_is_small(prompts, greedy_reference):
    params, expected = greedy_reference
    small = LLM(TARGET, DRAFT, dtype="float32", block_size=16, num_blocks=40)
    outputs = small.generate(prompts[:8], params, mode="sd", k=4, max_batch=8)
    assert [o.token_ids for o in outputs] == expected[:8]
    assert small.verifier.runner.blocks.num_free_blocks == 40
    assert small.drafter.runner.blocks.num_free_blocks == 40


def test_stop_conditions_and_blocks_return(llm, prompts, greedy_reference):
    _, expected = greedy_reference
    stop_token = expected[0][5]
    params = SamplingParams(max_tokens=24, stop_token_ids=(stop_token,), ignore_eos=True)
    out = llm.generate(prompts[:1], params, mode="sd", k=4)[0]
    assert out.token_ids == expected[0][:expected[0].index(stop_token) + 1]
    assert out.finish_reason == "stop"
    out = llm.generate(prompts[:1], SamplingParams(max_tokens=7, ignore_eos=True), mode="sd", k=5)[0]
    assert out.token_ids == expected[0][:7] and out.finish_reason == "length"
    assert llm.verifier.runner.blocks.num_free_blocks == llm.verifier.runner.config.num_blocks
    assert llm.drafter.runner.blocks.num_free_blocks == llm.drafter.runner.config.num_blocks


def test_bad_arguments(llm):
    with pytest.raises(ValueError, match="mode"):
        llm.generate(["x"], mode="psd")
    with pytest.raises(ValueError, match="k must be"):
        llm.generate(["x"], mode="sd", k=-1)
    with pytest.raises(ValueError, match="prompt is empty"):
        llm.generate([[]])
    with pytest.raises(ValueError, match="needs a draft"):
        LLM(TARGET).generate(["x"], mode="sd")


def test_synthetic_acceptance_is_benchmark_only(llm, prompts):
    from minedraft.verifier import Verifier

    runner = llm.verifier.runner
    for p, expect_all in [(1.0, True), (0.0, False)]:
        verifier = Verifier(runner, synthetic_acceptance=p)
        ids = llm.tokenizer.encode(prompts[0])
        verifier.add_request("syn", ids, SamplingParams(), seed=1)
        drafts = [7, 8, 9, 10]                       # nonsense drafts: only synthetic mode accepts them
        out = verifier.verify([("syn", drafts)])[0]
        assert out[:-1] == (drafts if expect_all else [])
        verifier.remove_request("syn")
    with pytest.raises(ValueError, match="synthetic_acceptance"):
        Verifier(runner, synthetic_acceptance=1.5)
    with pytest.raises(ValueError, match="synthetic_acceptance"):
        Verifier(runner, synthetic_acceptance=[])
    from verifier_svc.main import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--synthetic-acceptance", "0.8"])           # refused without --benchmark-only
    assert parse_args(["--synthetic-acceptance", "0.8", "--benchmark-only"]).synthetic_acceptance == [0.8]
    assert parse_args(["--synthetic-acceptance", "0.9", "0.1", "--benchmark-only"]).synthetic_acceptance == [0.9, 0.1]
    with pytest.raises(SystemExit):
        parse_args(["--synthetic-acceptance", "0.9", "1.1", "--benchmark-only"])   # a rate outside [0, 1]


def test_several_synthetic_rates_are_taken_by_new_requests_in_turn(llm, prompts):
    """The mixed-acceptance stand-in: request 1 drafts at the first rate, request 2 at the
    second, request 3 at the first again, whatever order they are verified in."""
    from minedraft.verifier import Verifier

    verifier = Verifier(llm.verifier.runner, synthetic_acceptance=[1.0, 0.0])
    assert verifier.synthetic_acceptance == 0.5                 # GetInfo's figure: the mean
    ids = llm.tokenizer.encode(prompts[0])
    for rid in ("a", "b", "c"):
        verifier.add_request(rid, ids, SamplingParams(), seed=1)
    drafts = [7, 8, 9, 10]
    out = verifier.verify([("c", drafts), ("b", drafts), ("a", drafts)])
    assert [o[:-1] for o in out] == [drafts, [], drafts]
    verifier.remove_all()
    assert not verifier._synthetic_rate                         # forgotten with their requests
    verifier.add_request("d", ids, SamplingParams(), seed=1)    # the fourth request: the second rate
    assert verifier.verify([("d", drafts)])[0][:-1] == []
    verifier.remove_request("d")


def test_synthetic_verdicts_use_each_rows_uniform_of_the_full_noise(llm, prompts):
    """A greedy batch draws only each row's uniform, not a row of noise over the vocabulary;
    the verdicts are those the full row's uniform gives."""
    from minedraft.sampling import VERIFY_STREAM, request_noise
    from minedraft.verifier import Verifier

    runner = llm.verifier.runner
    ids = llm.tokenizer.encode(prompts[0])
    drafts = [7, 8, 9, 10, 11, 12]
    for seed in range(6):
        verifier = Verifier(runner, synthetic_acceptance=0.5)
        verifier.add_request("half", ids, SamplingParams(), seed=seed)
        uniform, _ = request_noise([seed], [list(range(len(ids), len(ids) + len(drafts) + 1))], VERIFY_STREAM,
                                   runner.vocab_size, "cpu")
        expected = next((j for j, u in enumerate(uniform.tolist()[:len(drafts)]) if u > 0.5), len(drafts))
        assert verifier.verify([("half", drafts)])[0][:-1] == drafts[:expected]
        verifier.remove_request("half")
