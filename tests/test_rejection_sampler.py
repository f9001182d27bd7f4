"""The rejection sampler, tested three ways: hand-built cases, seeded determinism, and a
statistical check that its output is distributed exactly as the target's."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from scipy.stats import chisquare

from minedraft.rejection_sampler import rejection_sample
from minedraft.sampling import VERIFY_STREAM, processed_probs, request_noise

torch.set_num_threads(1)

ALPHA = 1e-3


def _one_hot(tokens: list[int], vocab_size: int) -> torch.Tensor:  # [len(tokens), V]
    return torch.nn.functional.one_hot(torch.tensor(tokens), vocab_size).float()


def _sample(
    drafts: list[int],
    num_draft_tokens: list[int],
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    greedy: list[bool],
    uniform: torch.Tensor | None = None,
    exponential: torch.Tensor | None = None,
) -> list[list[int]]:
    rows = target_probs.shape[0]
    return rejection_sample(
        torch.tensor(drafts, dtype=torch.int64),
        num_draft_tokens,
        draft_probs,
        target_probs,
        torch.tensor(greedy, dtype=torch.bool),
        torch.full((rows,), 0.5) if uniform is None else uniform,
        torch.ones_like(target_probs) if exponential is None else exponential,
    )


# ---- hand-built cases -------------------------------------------------------------------


def test_greedy_all_accepted_then_bonus() -> None:
    target = _one_hot([1, 2, 3, 4], 5)
    assert _sample([1, 2, 3], [3], None, target, [True]) == [[1, 2, 3, 4]]


def test_greedy_first_mismatch_is_recovered() -> None:
    target = _one_hot([1, 0, 3, 4], 5)  # the third draft matches but comes after a mismatch
    assert _sample([1, 2, 3], [3], None, target, [True]) == [[1, 0]]


def test_no_drafts_emits_only_the_bonus() -> None:
    assert _sample([], [0], None, _one_hot([2], 5), [True]) == [[2]]
    sampled_target = torch.tensor([[0.1, 0.2, 0.7]])
    exponential = torch.tensor([[1.0, 1.0, 10.0]])  # race: 0.1, 0.2, 0.07 -> token 1
    assert _sample([], [0], None, sampled_target, [False], exponential=exponential) == [[1]]


def test_mixed_batch_of_greedy_and_sampled_requests() -> None:
    vocab_size = 6
    q_b = torch.tensor([[0.1, 0.1, 0.5, 0.1, 0.1, 0.1], [0.6, 0.4, 0, 0, 0, 0], [1 / 6] * 6])
    p_b = torch.stack([q_b[0], _one_hot([3], 6)[0], q_b[2], q_b[2]])  # p == q, then p(0) = 0
    q_d = torch.tensor([[0.2, 0.1, 0.1, 0.1, 0.1, 0.4]])
    draft_probs = torch.cat([_one_hot([1, 4], vocab_size), q_b, q_d])
    target_probs = torch.cat([
        _one_hot([1, 4, 5], vocab_size),  # A greedy, k=2: all accepted, bonus 5
        p_b,  # B sampled, k=3: accept, reject (p(0)=0), residual is all on token 3
        _one_hot([0], vocab_size),  # C greedy, k=0: bonus only
        q_d, _one_hot([2], vocab_size),  # D sampled, k=1: p == q accepts, bonus is certain
    ])
    drafts = [1, 4, 2, 0, 3, 5]
    out = _sample(drafts, [2, 3, 0, 1], draft_probs, target_probs, [True, False, True, False])
    assert out == [[1, 4, 5], [2, 3], [0], [5, 2]]


def test_draft_the_target_forbids_is_always_rejected_and_recovered_from_residual() -> None:
    trials = 300
    q = torch.tensor([0.5, 0.5, 0.0, 0.0])
    p = torch.tensor([0.0, 0.5, 0.5, 0.0])  # residual max(p - q, 0) is all on token 2
    generator = torch.Generator().manual_seed(0)
    rows = 2 * trials
    out = _sample(
        [0] * trials, [1] * trials, q.repeat(trials, 1), p.repeat(rows, 1), [False] * trials,
        uniform=1 - torch.rand(rows, generator=generator),
        exponential=torch.empty(rows, 4).exponential_(generator=generator),
    )
    assert out == [[2]] * trials


def test_identical_draft_and_target_always_accepts() -> None:
    trials, k, vocab_size = 200, 3, 7
    generator = torch.Generator().manual_seed(1)
    probs = torch.softmax(torch.randn(trials * (k + 1), vocab_size, generator=generator), -1)
    draft_rows = torch.ones(trials * (k + 1), dtype=torch.bool)
    draft_rows[k :: k + 1] = False  # every request's bonus row
    draft_probs = probs[draft_rows]
    drafts = torch.multinomial(draft_probs, 1, generator=generator).flatten().tolist()
    out = _sample(
        drafts, [k] * trials, draft_probs, probs, [False] * trials,
        uniform=1 - torch.rand(trials * (k + 1), generator=generator),
        exponential=torch.empty_like(probs).exponential_(generator=generator),
    )
    assert [row[:k] for row in out] == [drafts[i * k : (i + 1) * k] for i in range(trials)]
    assert all(len(row) == k + 1 for row in out)


def test_greedy_drafter_with_sampled_target() -> None:
    """draft_probs=None means q is one-hot: accept with p(x), else resample p without x."""
    trials = 400
    p = torch.tensor([0.5, 0.5, 0.0, 0.0])
    bonus = _one_hot([3], 4)[0]
    target = torch.stack([p, bonus]).repeat(trials, 1)
    generator = torch.Generator().manual_seed(2)
    out = _sample(
        [0] * trials, [1] * trials, None, target, [False] * trials,
        uniform=1 - torch.rand(2 * trials, generator=generator),
        exponential=torch.empty(2 * trials, 4).exponential_(generator=generator),
    )
    assert {tuple(row) for row in out} == {(0, 3), (1,)}


def test_shape_and_dtype_errors_are_clear() -> None:
    target = _one_hot([1, 2, 3], 5)
    with pytest.raises(ValueError, match="target_probs must have shape"):
        _sample([1, 2, 3], [3], None, target, [True])
    with pytest.raises(ValueError, match="draft_probs must have shape"):
        _sample([1, 2], [2], torch.ones(3, 5), target, [True])
    with pytest.raises(ValueError, match="num_draft_tokens must be >= 0"):
        _sample([], [-1, 2], None, target, [True, True])
    with pytest.raises(ValueError, match="is_greedy must have shape"):
        _sample([1, 2], [2], None, target, [True, False])
    with pytest.raises(ValueError, match="int64"):
        rejection_sample(torch.tensor([1, 2], dtype=torch.int32), [2], None, target,
                         torch.tensor([True]), torch.ones(3), torch.ones(3, 5))


# ---- seeded determinism -----------------------------------------------------------------


@dataclass(frozen=True)
class _Request:
    drafts: list[int]  # [k]
    draft_probs: torch.Tensor  # [k, V]
    target_probs: torch.Tensor  # [k + 1, V]
    greedy: bool
    seed: int
    first_position: int  # position of the first draft token


def _random_request(k: int, greedy: bool, seed: int, generator: torch.Generator) -> _Request:
    vocab_size = 9
    draft_probs = torch.softmax(torch.randn(k, vocab_size, generator=generator), -1)
    target_logits = torch.randn(k + 1, vocab_size, generator=generator)
    temperature = torch.full((k + 1,), 0.0 if greedy else 1.0)
    target_probs = processed_probs(target_logits, temperature, None, None)
    drafts = torch.multinomial(draft_probs, 1, generator=generator).flatten().tolist() if k else []
    return _Request(drafts, draft_probs, target_probs, greedy, seed, 10 + seed)


def _run_batch(requests: list[_Request]) -> list[list[int]]:
    """Noise comes from request_noise, keyed by (seed, position), as the runner does it."""
    vocab_size = requests[0].target_probs.shape[1]
    uniform, exponential = request_noise(
        [r.seed for r in requests],
        [list(range(r.first_position, r.first_position + len(r.drafts) + 1)) for r in requests],
        VERIFY_STREAM,
        vocab_size,
        "cpu",
    )
    return rejection_sample(
        torch.tensor([t for r in requests for t in r.drafts], dtype=torch.int64),
        [len(r.drafts) for r in requests],
        torch.cat([r.draft_probs for r in requests]),
        torch.cat([r.target_probs for r in requests]),
        torch.tensor([r.greedy for r in requests]),
        uniform,
        exponential,
    )


def test_same_seeds_give_same_outputs_regardless_of_batch() -> None:
    generator = torch.Generator().manual_seed(3)
    shapes = [(4, False), (0, False), (3, True), (5, False)] * 5  # (k, greedy)
    requests = [
        _random_request(k, greedy, seed, generator) for seed, (k, greedy) in enumerate(shapes)
    ]
    batched = _run_batch(requests)
    assert _run_batch(requests) == batched
    alone = [_run_batch([r])[0] for r in requests]
    assert alone == batched
    reordered = _run_batch(requests[::-1])
    assert reordered[::-1] == batched


# ---- statistical losslessness -----------------------------------------------------------

_VOCAB = 8
_K = 3
_TRIALS = 20000


def _goodness_of_fit_pvalue(tokens: torch.Tensor, probs: torch.Tensor) -> float:
    """Chi-square p-value of tokens against probs; bins expected < 5 are merged."""
    counts = torch.bincount(tokens, minlength=probs.numel()).double()
    if counts[probs == 0].sum() > 0:
        return 0.0  # a token the target forbids is a certain failure
    expected = probs.double() * tokens.numel()
    big = expected >= 5
    observed_bins = torch.cat([counts[big], counts[~big].sum().reshape(1)])
    expected_bins = torch.cat([expected[big], expected[~big].sum().reshape(1)])
    keep = expected_bins > 0
    observed_bins, expected_bins = observed_bins[keep], expected_bins[keep]
    if observed_bins.numel() < 2:
        return 1.0  # one allowed outcome and no forbidden ones: nothing left to test
    expected_bins *= observed_bins.sum() / expected_bins.sum()  # float32 probs sum ~1
    return float(chisquare(observed_bins.numpy(), expected_bins.numpy()).pvalue)


def _position_tokens(
    target_probs: torch.Tensor,  # [K + 1, V]
    draft_probs: torch.Tensor,  # [K, V]
    greedy_drafter: bool,
    generator: torch.Generator,
) -> torch.Tensor:  # [_TRIALS, K + 1], the token a decoder ends up with at each position
    """One verify step for _TRIALS requests of an i.i.d.-per-position model.

    Positions past a request's output are sampled straight from the target, which is what
    the next decode step would produce if the sampler is right. Then each column's marginal
    must equal that position's target distribution, with no length conditioning.
    """
    if greedy_drafter:
        drafts = draft_probs.argmax(-1).repeat(_TRIALS)  # [_TRIALS * K]
        flat_draft_probs = None
    else:
        drafts = torch.multinomial(draft_probs, _TRIALS, True, generator=generator).T.flatten()
        flat_draft_probs = draft_probs.repeat(_TRIALS, 1)
    rows = _TRIALS * (_K + 1)
    out = rejection_sample(
        drafts, [_K] * _TRIALS, flat_draft_probs, target_probs.repeat(_TRIALS, 1),
        torch.zeros(_TRIALS, dtype=torch.bool),
        1 - torch.rand(rows, generator=generator),
        torch.empty(rows, _VOCAB).exponential_(generator=generator),
    )
    next_steps = torch.multinomial(target_probs, _TRIALS, True, generator=generator).T
    lengths = torch.tensor([len(row) for row in out])
    padded = torch.tensor([row + [0] * (_K + 1 - len(row)) for row in out])
    produced = torch.arange(_K + 1).unsqueeze(0) < lengths.unsqueeze(1)
    return torch.where(produced, padded, next_steps)


def _models(seed: int, temperature: float, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    target_logits = torch.randn(_K + 1, _VOCAB, generator=generator)
    # A drafter that roughly agrees with the target, so every output length occurs often.
    draft_logits = target_logits[:_K] + torch.randn(_K, _VOCAB, generator=generator)
    target_probs = processed_probs(
        target_logits, torch.full((_K + 1,), temperature), None, torch.full((_K + 1,), top_p)
    )
    return target_probs, torch.softmax(draft_logits, -1)


@pytest.mark.parametrize(
    ("temperature", "top_p", "greedy_drafter"),
    [(1.0, 1.0, False), (0.7, 1.0, False), (1.0, 0.8, False), (1.0, 1.0, True)],
)
def test_output_is_distributed_as_the_target(
    temperature: float, top_p: float, greedy_drafter: bool
) -> None:
    """Chi-square per output position at ALPHA = 1e-3.

    The seeds are fixed, so the test is deterministic; over random seeds each check would
    raise a false alarm with probability ~ALPHA (about 1.6% for all 16 checks in this file).
    """
    target_probs, draft_probs = _models(seed=10, temperature=temperature, top_p=top_p)
    generator = torch.Generator().manual_seed(20)
    tokens = _position_tokens(target_probs, draft_probs, greedy_drafter, generator)
    for position in range(_K + 1):
        pvalue = _goodness_of_fit_pvalue(tokens[:, position], target_probs[position])
        assert pvalue > ALPHA, f"position {position}: p-value {pvalue:.2e}"


def test_the_check_catches_wrong_samplers() -> None:
    """The same check must reject two broken samplers, or passing it would mean nothing."""
    target_probs, draft_probs = _models(seed=10, temperature=1.0, top_p=1.0)
    p, q = target_probs[0], draft_probs[0]
    generator = torch.Generator().manual_seed(30)
    drafts = torch.multinomial(q, _TRIALS, True, generator=generator)

    # Always accepting the draft yields q, not p.
    assert _goodness_of_fit_pvalue(drafts, p) < ALPHA

    # Accepting correctly but resampling p (not the residual) on rejection: min(p, q) + (1-b)p.
    accept = torch.rand(_TRIALS, generator=generator) * q[drafts] <= p[drafts]
    resampled = torch.multinomial(p, _TRIALS, True, generator=generator)
    assert _goodness_of_fit_pvalue(torch.where(accept, drafts, resampled), p) < ALPHA
