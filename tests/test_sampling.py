"""processed_probs filters, per-position noise, and exponential-race sampling."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare, kstest

from minedraft.sampling import (
    VERIFY_STREAM,
    noise_key,
    processed_probs,
    request_noise,
    sample_with_noise,
)

torch.set_num_threads(1)

ALPHA = 1e-3  # fixed seed -> deterministic; across seeds a false alarm would occur ~ALPHA


def _rows(values: list[float], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def test_greedy_rows_are_one_hot_argmax_lowest_index_on_ties() -> None:
    logits = torch.tensor([[0.1, 3.0, 3.0, -1.0], [2.0, 0.0, 1.0, 0.5]])
    probs = processed_probs(logits, _rows([0.0, 0.0]), None, None)
    assert torch.equal(probs, torch.tensor([[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]))
    assert probs.dtype == torch.float32


def test_temperature_scaling_matches_softmax() -> None:
    logits = torch.randn(3, 11, generator=torch.Generator().manual_seed(0))
    temperature = _rows([1.0, 0.5, 2.0])
    probs = processed_probs(logits, temperature, None, None)
    expected = torch.softmax(logits / temperature.unsqueeze(1), dim=-1)
    torch.testing.assert_close(probs, expected)


def test_top_k_keeps_exactly_k_even_with_ties() -> None:
    logits = torch.tensor([[1.0, 2.0, 2.0, 2.0, 0.0], [5.0, 4.0, 3.0, 2.0, 1.0]])
    probs = processed_probs(logits, _rows([1.0, 1.0]), torch.tensor([2, 0]), None)
    assert probs[0].nonzero().flatten().tolist() == [1, 2]  # ties keep vocabulary order
    torch.testing.assert_close(probs[0, 1:3], torch.tensor([0.5, 0.5]))
    assert (probs[1] > 0).all()  # top_k = 0 is off


def test_top_p_keeps_minimal_nucleus() -> None:
    base = torch.tensor([0.05, 0.5, 0.15, 0.3])  # sorted: 0.5, 0.3, 0.15, 0.05
    logits = base.log().expand(4, 4).contiguous()
    top_p = _rows([0.4, 0.75, 0.85, 1.0])
    probs = processed_probs(logits, torch.ones(4), None, top_p)
    kept = [set(row.nonzero().flatten().tolist()) for row in probs]
    assert kept == [{1}, {1, 3}, {1, 2, 3}, {0, 1, 2, 3}]
    torch.testing.assert_close(probs[1], torch.tensor([0.0, 0.5, 0.0, 0.3]) / 0.8)


def test_mixed_rows_match_row_by_row() -> None:
    logits = torch.randn(4, 9, generator=torch.Generator().manual_seed(1))
    temperature = _rows([0.0, 0.8, 1.3, 1.0])
    top_k = torch.tensor([3, 4, 0, 2])
    top_p = _rows([0.5, 1.0, 0.6, 0.9])
    batched = processed_probs(logits, temperature, top_k, top_p)
    for row in range(4):
        one = slice(row, row + 1)
        alone = processed_probs(logits[one], temperature[one], top_k[one], top_p[one])
        torch.testing.assert_close(batched[one], alone)


def test_sorting_is_skipped_when_no_row_filters(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_sort(*args: object, **kwargs: object) -> None:
        raise AssertionError("torch.sort called although no row filters")

    monkeypatch.setattr(torch, "sort", no_sort)
    logits = torch.randn(2, 5)
    processed_probs(logits, torch.ones(2), None, None)
    processed_probs(logits, torch.ones(2), torch.zeros(2, dtype=torch.int64), torch.ones(2))


def test_bad_shapes_raise() -> None:
    with pytest.raises(ValueError, match="temperature"):
        processed_probs(torch.zeros(2, 3), torch.ones(3), None, None)


def test_noise_key_is_keyed_by_all_three_ints() -> None:
    assert noise_key(7, 3, VERIFY_STREAM) == noise_key(7, 3, VERIFY_STREAM)
    others = {noise_key(8, 3, VERIFY_STREAM), noise_key(7, 4, VERIFY_STREAM), noise_key(7, 3, VERIFY_STREAM + 1)}
    assert noise_key(7, 3, VERIFY_STREAM) not in others and len(others) == 3
    with pytest.raises(ValueError, match="position"):
        noise_key(1, -1, VERIFY_STREAM)


def _textbook_splitmix64(seed: int, count: int) -> list[int]:
    """Outputs 1..count of SplitMix64 (Steele et al.), in Python's exact integers."""
    mask, state, outputs = 2**64 - 1, seed, []
    for _ in range(count):
        state = (state + 0x9E3779B97F4A7C15) & mask
        z = ((state ^ (state >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        outputs.append(z ^ (z >> 31))
    return outputs


def test_request_noise_is_the_splitmix64_stream_of_the_key() -> None:
    """Tensor ops must reproduce exact 64-bit arithmetic: that is what makes the noise the
    same on every device, so a drafter and a verifier on different ones agree."""
    seed, position, vocab_size = 2**64 - 1, 2**40, 5
    uniform, exponential = request_noise([seed], [[position]], VERIFY_STREAM, vocab_size, "cpu")
    outputs = _textbook_splitmix64(noise_key(seed, position, VERIFY_STREAM), vocab_size + 1)
    units = torch.tensor([((bits >> 11) + 1) / 2**53 for bits in outputs], dtype=torch.float64)
    assert torch.equal(uniform, units[:1].float())       # output 1 -> uniform
    assert torch.equal(exponential[0], (-units[1:].log()).float())  # output 2 + v -> token v


def test_request_noise_rows_do_not_depend_on_vocab_size() -> None:
    """A smaller vocabulary gets a prefix of the same row, so drafts stay coupled to it."""
    small_u, small_e = request_noise([3, 4], [[0], [9]], VERIFY_STREAM, 7, "cpu")
    large_u, large_e = request_noise([3, 4], [[0], [9]], VERIFY_STREAM, 50, "cpu")
    assert torch.equal(small_u, large_u) and torch.equal(small_e, large_e[:, :7])


def test_request_noise_is_uniform_and_exponential() -> None:
    """Kolmogorov-Smirnov at ALPHA: the race is exact only if E is really Exp(1)."""
    uniform, exponential = request_noise(list(range(400)), [list(range(50))] * 400, VERIFY_STREAM, 10, "cpu")
    assert kstest(uniform.double().numpy(), "uniform").pvalue > ALPHA
    assert kstest(exponential.flatten().double().numpy(), "expon").pvalue > ALPHA
    assert kstest(exponential[:, 3].double().numpy(), "expon").pvalue > ALPHA   # one token alone


def test_request_noise_does_not_depend_on_batching() -> None:
    uniform, exponential = request_noise([11, 22, 33], [[5, 6], [], [9]], VERIFY_STREAM, 6, "cpu")
    assert uniform.shape == (3,) and exponential.shape == (3, 6)
    assert ((uniform > 0) & (uniform <= 1)).all() and (exponential > 0).all()
    alone_u, alone_e = request_noise([33], [[9]], VERIFY_STREAM, 6, "cpu")
    assert torch.equal(uniform[2:], alone_u) and torch.equal(exponential[2:], alone_e)
    split_u, split_e = request_noise([11], [[6]], VERIFY_STREAM, 6, "cpu")
    assert torch.equal(uniform[1:2], split_u) and torch.equal(exponential[1:2], split_e)
    again_u, again_e = request_noise([11, 22, 33], [[5, 6], [], [9]], VERIFY_STREAM, 6, "cpu")
    assert torch.equal(uniform, again_u) and torch.equal(exponential, again_e)
    assert not torch.equal(exponential[0], exponential[1])


def test_sample_with_noise_matches_probs() -> None:
    """Chi-square goodness of fit at ALPHA; zero-probability tokens must never appear."""
    num_samples = 20000
    probs = torch.tensor([0.4, 0.25, 0.0, 0.2, 0.1, 0.05])
    generator = torch.Generator().manual_seed(1234)
    exponential = torch.empty(num_samples, 6).exponential_(generator=generator)
    tokens = sample_with_noise(probs.expand(num_samples, 6), exponential)
    counts = torch.bincount(tokens, minlength=6)
    assert counts[2] == 0
    support = probs > 0
    result = chisquare(counts[support].numpy(), (probs[support] * num_samples).numpy())
    assert result.pvalue > ALPHA, result
