"""The coupled rejection sampler, tested three ways: hand-built cases, seeded determinism
(including outputs that do not depend on the draft length k), and a statistical check that
its output is distributed exactly as the target's."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from scipy.stats import binomtest, chisquare

from minedraft.rejection_sampler import rejection_sample
from minedraft.sampling import VERIFY_STREAM, processed_probs, request_noise, sample_with_noise

torch.set_num_threads(1)

ALPHA = 1e-3


def _one_hot(tokens: list[int], vocab_size: int) -> torch.Tensor:  # [len(tokens), V]
    return torch.nn.functional.one_hot(torch.tensor(tokens), vocab_size).float()


def _sample(
    drafts: list[int],
    num_draft_tokens: list[int],
    target_probs: torch.Tensor,
    greedy: list[bool],
    exponential: torch.Tensor | None = None,
) -> list[list[int]]:
    return rejection_sample(
        torch.tensor(drafts, dtype=torch.int64),
        num_draft_tokens,
        target_probs,
        torch.tensor(greedy, dtype=torch.bool),
        torch.ones_like(target_probs) if exponential is None else exponential,
    )


# ---- hand-built cases -------------------------------------------------------------------


def test_greedy_all_accepted_then_bonus() -> None:
    target = _one_hot([1, 2, 3, 4], 5)
    assert _sample([1, 2, 3], [3], target, [True]) == [[1, 2, 3, 4]]


def test_greedy_first_mismatch_is_recovered() -> None:
    target = _one_hot([1, 0, 3, 4], 5)  # the third draft matches but comes after a mismatch
    assert _sample([1, 2, 3], [3], target, [True]) == [[1, 0]]


def test_no_drafts_emits_only_the_bonus() -> None:
    assert _sample([], [0], _one_hot([2], 5), [True]) == [[2]]
    sampled_target = torch.tensor([[0.1, 0.2, 0.7]])
    exponential = torch.tensor([[1.0, 1.0, 10.0]])  # race: 0.1, 0.2, 0.07 -> token 1
    assert _sample([], [0], sampled_target, [False], exponential=exponential) == [[1]]


def test_draft_equal_to_the_race_winner_is_accepted_and_any_other_rejected() -> None:
    """Not the most likely token but the race's winner is what plain decoding emits."""
    p = torch.tensor([0.1, 0.2, 0.7])
    target = torch.stack([p, p])
    exponential = torch.tensor([[1.0, 1.0, 10.0], [10.0, 1.0, 1.0]])  # winners: 1, then 2
    assert _sample([1], [1], target, [False], exponential) == [[1, 2]]  # accepted, then bonus
    assert _sample([2], [1], target, [False], exponential) == [[1]]  # rejected: the winner
    assert _sample([0], [1], target, [False], exponential) == [[1]]


def test_mixed_batch_of_greedy_and_sampled_requests() -> None:
    vocab_size = 4
    p = torch.tensor([0.4, 0.3, 0.2, 0.1])
    target_probs = torch.cat([
        _one_hot([1, 3, 2], vocab_size),  # A greedy, k=2: all accepted, bonus 2
        p.repeat(4, 1),  # B sampled, k=3: accept, reject, (ignored), winners 2, 0, 3, 1
        _one_hot([0], vocab_size),  # C greedy, k=0: bonus only
        p.repeat(2, 1),  # D sampled, k=1: accept, bonus winner 3
    ])
    # Each row's noise makes one token win the race: E = 1 there and 100 elsewhere.
    winners = [0, 0, 0, 2, 0, 3, 1, 0, 2, 3]
    exponential = torch.full((len(winners), vocab_size), 100.0)
    exponential[torch.arange(len(winners)), winners] = 1.0
    drafts = [1, 3, 2, 1, 3, 2]
    out = _sample(drafts, [2, 3, 0, 1], target_probs, [True, False, True, False], exponential)
    assert out == [[1, 3, 2], [2, 0], [0], [2, 3]]


def test_draft_the_target_forbids_is_always_rejected() -> None:
    trials = 300
    p = torch.tensor([0.0, 0.5, 0.5, 0.0])
    generator = torch.Generator().manual_seed(0)
    exponential = torch.empty(2 * trials, 4).exponential_(generator=generator)
    out = _sample([0] * trials, [1] * trials, p.repeat(2 * trials, 1), [False] * trials, exponential)
    winners = sample_with_noise(p.repeat(trials, 1), exponential[::2]).tolist()
    assert out == [[w] for w in winners]
    assert set(winners) == {1, 2}


def test_drafts_raced_on_the_same_noise_as_an_identical_target_are_always_accepted() -> None:
    trials, k, vocab_size = 200, 3, 7
    generator = torch.Generator().manual_seed(1)
    probs = torch.softmax(torch.randn(trials * (k + 1), vocab_size, generator=generator), -1)
    exponential = torch.empty_like(probs).exponential_(generator=generator)
    draft_rows = torch.ones(trials * (k + 1), dtype=torch.bool)
    draft_rows[k :: k + 1] = False  # every request's bonus row
    drafts = sample_with_noise(probs[draft_rows], exponential[draft_rows]).tolist()
    out = _sample(drafts, [k] * trials, probs, [False] * trials, exponential)
    assert [row[:k] for row in out] == [drafts[i * k : (i + 1) * k] for i in range(trials)]
    assert all(len(row) == k + 1 for row in out)


def test_greedy_drafter_with_sampled_target() -> None:
    """An argmax draft is kept exactly when the target's race picks the same token."""
    trials = 400
    p = torch.tensor([0.5, 0.5, 0.0, 0.0])
    bonus = _one_hot([3], 4)[0]
    target = torch.stack([p, bonus]).repeat(trials, 1)
    generator = torch.Generator().manual_seed(2)
    exponential = torch.empty(2 * trials, 4).exponential_(generator=generator)
    out = _sample([0] * trials, [1] * trials, target, [False] * trials, exponential)
    winners = sample_with_noise(p.repeat(trials, 1), exponential[::2]).tolist()
    assert out == [[0, 3] if w == 0 else [1] for w in winners]
    assert {tuple(row) for row in out} == {(0, 3), (1,)}


def test_shape_and_dtype_errors_are_clear() -> None:
    target = _one_hot([1, 2, 3], 5)
    with pytest.raises(ValueError, match="target_probs must have shape"):
        _sample([1, 2, 3], [3], target, [True])
    with pytest.raises(ValueError, match="exponential must have shape"):
        rejection_sample(torch.tensor([1, 2]), [2], target, torch.tensor([True]), torch.ones(3, 4))
    with pytest.raises(ValueError, match="num_draft_tokens must be >= 0"):
        _sample([], [-1, 2], target, [True, True])
    with pytest.raises(ValueError, match="is_greedy must have shape"):
        _sample([1, 2], [2], target, [True, False])
    with pytest.raises(ValueError, match="int64"):
        rejection_sample(torch.tensor([1, 2], dtype=torch.int32), [2], target,
                         torch.tensor([True]), torch.ones(3, 5))


# ---- seeded determinism -----------------------------------------------------------------


@dataclass(frozen=True)
class _Request:
    drafts: list[int]  # [k]
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
    return _Request(drafts, target_probs, greedy, seed, 10 + seed)


def _run_batch(requests: list[_Request]) -> list[list[int]]:
    """Noise comes from request_noise, keyed by (seed, position), as the runner does it."""
    vocab_size = requests[0].target_probs.shape[1]
    _, exponential = request_noise(
        [r.seed for r in requests],
        [list(range(r.first_position, r.first_position + len(r.drafts) + 1)) for r in requests],
        VERIFY_STREAM,
        vocab_size,
        "cpu",
    )
    return rejection_sample(
        torch.tensor([t for r in requests for t in r.drafts], dtype=torch.int64),
        [len(r.drafts) for r in requests],
        torch.cat([r.target_probs for r in requests]),
        torch.tensor([r.greedy for r in requests]),
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


class _MarkovPair:
    """A toy target and a drafter that roughly agrees with it: each next-token distribution
    depends on the previous token only (rows of [V, V] tables)."""

    def __init__(self, vocab_size: int, temperature: float) -> None:
        generator = torch.Generator().manual_seed(4)
        logits = 2 * torch.randn(vocab_size, vocab_size, generator=generator)
        self.target = torch.softmax(logits / temperature, -1)
        self.draft = torch.softmax((logits + torch.randn(vocab_size, vocab_size, generator=generator))
                                   / temperature, -1)

    def decode(self, seed: int, num_tokens: int, schedule: list[int]) -> tuple[list[int], int]:
        """Decode with k taken from schedule in turn; drafts race on the verifier's noise, as
        Drafter does. -> (tokens, drafts accepted)."""
        tokens, num_accepted, step = [0], 0, 0
        vocab_size = self.target.shape[0]
        while len(tokens) < num_tokens:
            k = schedule[step % len(schedule)]
            step += 1
            positions = list(range(len(tokens), len(tokens) + k + 1))
            _, exponential = request_noise([seed], [positions], VERIFY_STREAM, vocab_size, "cpu")
            drafts = []
            for j in range(k):
                previous = drafts[-1] if drafts else tokens[-1]
                drafts.append(int(sample_with_noise(self.draft[previous : previous + 1], exponential[j : j + 1])))
            target_probs = self.target[torch.tensor(tokens[-1:] + drafts)]  # [k + 1, V]
            emitted = rejection_sample(torch.tensor(drafts, dtype=torch.int64), [k], target_probs,
                                       torch.tensor([False]), exponential)[0]
            num_accepted += len(emitted) - 1
            tokens.extend(emitted)
        return tokens[:num_tokens], num_accepted


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_sampled_output_does_not_depend_on_the_draft_lengths(temperature: float) -> None:
    """Plain decoding (k = 0), fixed k and k changing every step emit the same tokens."""
    pair = _MarkovPair(vocab_size=12, temperature=temperature)
    for seed in (0, 1, 2):
        plain, _ = pair.decode(seed, 60, [0])
        for schedule in ([1], [3], [5], [2, 0, 5, 1, 4, 3]):
            tokens, num_accepted = pair.decode(seed, 60, schedule)
            assert tokens == plain, (seed, schedule)
            assert num_accepted > 0  # the drafts were really used
        assert pair.decode(seed + 10, 60, [0])[0] != plain


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
    drafter: str,
    generator: torch.Generator,
) -> torch.Tensor:  # [_TRIALS, K + 1], the token a decoder ends up with at each position
    """One verify step for _TRIALS requests of an i.i.d.-per-position model, with the noise
    the runner uses (request_noise, one seed per request).

    drafter: "coupled" races q on the verifier's noise (as Drafter does), "independent"
    samples q with other noise, "greedy" proposes q's argmax; none may change the output
    distribution. Positions past a request's output are sampled straight from the target,
    which is what the next decode step would produce if the sampler is right. Then each
    column's marginal must equal that position's target distribution, with no length
    conditioning.
    """
    _, exponential = request_noise(list(range(_TRIALS)), [list(range(_K + 1))] * _TRIALS,
                                   VERIFY_STREAM, _VOCAB, "cpu")  # [_TRIALS * (K + 1), V]
    draft_rows = torch.arange(_TRIALS * (_K + 1)) % (_K + 1) < _K
    if drafter == "coupled":
        drafts = sample_with_noise(draft_probs.repeat(_TRIALS, 1), exponential[draft_rows])
    elif drafter == "independent":
        drafts = torch.multinomial(draft_probs, _TRIALS, True, generator=generator).T.flatten()
    else:
        drafts = draft_probs.argmax(-1).repeat(_TRIALS)  # [_TRIALS * K]
    out = rejection_sample(
        drafts, [_K] * _TRIALS, target_probs.repeat(_TRIALS, 1),
        torch.zeros(_TRIALS, dtype=torch.bool), exponential,
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
    ("temperature", "top_p", "drafter"),
    [(1.0, 1.0, "coupled"), (0.7, 1.0, "coupled"), (1.0, 0.8, "coupled"), (1.0, 1.0, "independent"),
     (1.0, 1.0, "greedy")],
)
def test_output_is_distributed_as_the_target(temperature: float, top_p: float, drafter: str) -> None:
    """Chi-square per output position at ALPHA = 1e-3.

    The seeds are fixed, so the test is deterministic; over random seeds each check would
    raise a false alarm with probability ~ALPHA (about 2% for all 21 checks in this file).
    """
    target_probs, draft_probs = _models(seed=10, temperature=temperature, top_p=top_p)
    generator = torch.Generator().manual_seed(20)
    tokens = _position_tokens(target_probs, draft_probs, drafter, generator)
    for position in range(_K + 1):
        pvalue = _goodness_of_fit_pvalue(tokens[:, position], target_probs[position])
        assert pvalue > ALPHA, f"position {position}: p-value {pvalue:.2e}"


def test_the_check_catches_wrong_samplers() -> None:
    """The same check must reject two broken samplers, or passing it would mean nothing."""
    target_probs, draft_probs = _models(seed=10, temperature=1.0, top_p=1.0)
    p, q = target_probs[0], draft_probs[0]
    generator = torch.Generator().manual_seed(30)
    exponential = torch.empty(_TRIALS, _VOCAB).exponential_(generator=generator)
    drafts = sample_with_noise(q.expand(_TRIALS, -1), exponential)

    # Always accepting the draft yields q, not p.
    assert _goodness_of_fit_pvalue(drafts, p) < ALPHA

    # Accepting correctly but redrawing the rejected position with fresh noise (a habit of
    # the classic rule's resampling): the output is then biased toward where the races agree.
    winners = sample_with_noise(p.expand(_TRIALS, -1), exponential)
    fresh = sample_with_noise(p.expand(_TRIALS, -1), torch.empty_like(exponential).exponential_(generator=generator))
    assert _goodness_of_fit_pvalue(torch.where(drafts == winners, drafts, fresh), p) < ALPHA


def test_acceptance_is_the_chance_the_two_races_agree() -> None:
    """The trade-off for k-independence, measured: a coupled draft is accepted with probability
    sum_v 1 / sum_w max(p_w / p_v, q_w / q_v), which lies between (1 - TV) / (1 + TV) and the
    classic rule's 1 - TV."""
    target_probs, draft_probs = _models(seed=10, temperature=1.0, top_p=1.0)
    p, q = target_probs[0].double(), draft_probs[0].double()
    ratios = torch.maximum(p / p.unsqueeze(1), q / q.unsqueeze(1))  # [v, w]
    agree = float((1 / ratios.sum(dim=1)).sum())
    total_variation = float((p - q).abs().sum() / 2)
    assert (1 - total_variation) / (1 + total_variation) <= agree <= 1 - total_variation

    _, exponential = request_noise(list(range(_TRIALS)), [[0, 1]] * _TRIALS, VERIFY_STREAM, _VOCAB, "cpu")
    drafts = sample_with_noise(draft_probs[0].expand(_TRIALS, -1), exponential[::2])
    out = rejection_sample(drafts, [1] * _TRIALS, target_probs[:2].repeat(_TRIALS, 1),
                           torch.zeros(_TRIALS, dtype=torch.bool), exponential)
    num_accepted = sum(len(row) - 1 for row in out)
    assert binomtest(num_accepted, _TRIALS, agree).pvalue > ALPHA
