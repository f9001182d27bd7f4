"""SamplingParams rejects bad input by name and normalises list inputs."""

from __future__ import annotations

import dataclasses
import math

import pytest

from minedraft.sampling_params import SamplingParams


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"temperature": -1.0}, "temperature"),
        ({"temperature": math.inf}, "temperature"),
        ({"temperature": math.nan}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"seed": -1}, "seed"),
        ({"seed": 2**63}, "seed"),
        ({"stop_token_ids": (1, -2)}, "stop_token_ids"),
        ({"stop_token_ids": [1, 2.5]}, "stop_token_ids"),
    ],
)
def test_invalid_values_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_temperature_message_shows_bound_and_value() -> None:
    with pytest.raises(ValueError, match=r"temperature must be >= 0, got -1\.0"):
        SamplingParams(temperature=-1.0)


def test_lists_become_tuples() -> None:
    params = SamplingParams(stop_token_ids=[2, 7], stop=["\n\n", "END"])
    assert params.stop_token_ids == (2, 7)
    assert params.stop == ("\n\n", "END")
    hash(params)  # hashable once lists are gone


def test_is_greedy_and_defaults() -> None:
    assert SamplingParams().is_greedy
    assert not SamplingParams(temperature=0.7).is_greedy
    params = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, seed=2**63 - 1)
    assert (params.top_p, params.top_k, params.seed) == (0.9, 50, 2**63 - 1)


def test_frozen() -> None:
    params = SamplingParams()
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.temperature = 1.0  # type: ignore[misc]
