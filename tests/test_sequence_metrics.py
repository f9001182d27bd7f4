"""Token-level stop conditions and the one definition of acceptance metrics."""

from __future__ import annotations

import pytest

from minedraft.metrics import AcceptanceStats
from minedraft.sampling_params import SamplingParams
from minedraft.sequence import FinishReason, Sequence


def _seq(**params) -> Sequence:
    return Sequence("r", [1, 2, 3], SamplingParams(**params), seed=0, eos_token_ids=(0,), max_model_len=20)


def test_append_stops_at_eos_and_drops_the_rest():
    seq = _seq(max_tokens=10)
    assert seq.append([5, 0, 7]) == [5, 0]
    assert seq.finish_reason == FinishReason.STOP and seq.output_token_ids == [5, 0]


def test_ignore_eos_and_stop_token_ids():
    seq = _seq(max_tokens=10, ignore_eos=True, stop_token_ids=(9,))
    assert seq.append([0, 4]) == [0, 4] and not seq.is_finished
    assert seq.append([9, 1]) == [9] and seq.finish_reason == FinishReason.STOP


def test_max_tokens_and_model_length():
    seq = _seq(max_tokens=4)
    assert seq.draft_length(5) == 3           # a step emits up to k + 1 tokens
    assert seq.append([5, 6, 7, 8, 9]) == [5, 6, 7, 8] and seq.finish_reason == FinishReason.LENGTH
    long_seq = _seq(max_tokens=100)
    long_seq.append(list(range(10, 26)))      # 3 prompt + 16 = 19 of 20 positions
    assert long_seq.remaining == 1 and long_seq.draft_length(4) == 0
    long_seq.append([30, 31])
    assert long_seq.num_tokens == 20 and long_seq.finish_reason == FinishReason.LENGTH


def test_acceptance_stats_definitions():
    stats = AcceptanceStats()
    stats.record(4, 4)      # all accepted: 5 tokens
    stats.record(4, 1)      # 2 tokens
    stats.record(2, 0)      # 1 token
    assert stats.mean_acceptance_length == pytest.approx(8 / 3)   # bonus included
    assert stats.acceptance_rate == pytest.approx(5 / 10)
    assert stats.acceptance_rate_per_position == [2 / 3, 1 / 3, 1 / 2, 1 / 2]
    other = AcceptanceStats()
    other.record(1, 1)
    stats.merge(other)
    assert stats.num_steps == 4 and stats.drafted_at[0] == 4 and stats.accepted_at[0] == 3
    with pytest.raises(ValueError):
        stats.record(2, 3)
