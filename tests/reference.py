"""The greedy reference every test of lossless decoding checks against, in-process or served.

Speculative decoding, batching and tensor parallelism change the order in which floats are
summed, so a served greedy token may differ from the in-process target's where the target's
top two logits are all but equal. `assert_matches_reference` allows that and nothing else.
"""

from __future__ import annotations

import os

from minedraft import bundled
from minedraft.llm import LLM
from minedraft.model_runner import ForwardChunk
from minedraft.sampling_params import SamplingParams

TARGET = os.environ.get("MINEDRAFT_TEST_TARGET", bundled.TARGET)
DRAFT = os.environ.get("MINEDRAFT_TEST_DRAFT", bundled.DRAFT)
NEAR_TIE = 1e-5          # top-1 minus top-2 target logit below this: either token is a right answer


def greedy_reference(prompts: list[str], max_tokens: int) -> tuple[LLM, list[list[int]]]:
    """The in-process target's plain greedy output: what every served mode must reproduce."""
    llm = LLM(TARGET, dtype="float32")
    outputs = llm.generate(prompts, SamplingParams(max_tokens=max_tokens, ignore_eos=True), mode="ar", max_batch=8)
    return llm, [o.token_ids for o in outputs]


def divergence(llm: LLM, prompt: str, expected: list[int], got: list[int]) -> tuple[int, float]:
    """(the first position where `got` leaves `expected`, the target's top-1 minus top-2 logit
    there: a near-tie when under NEAR_TIE); (-1, inf) when one only stops early or late (no tie)."""
    first = next((i for i, (a, b) in enumerate(zip(expected, got)) if a != b), None)
    if first is None:
        return -1, float("inf")
    runner = llm.verifier.runner
    logits = runner.forward([ForwardChunk("near-tie-check", llm.tokenizer.encode(prompt) + expected[:first])])[0]
    runner.free("near-tie-check")
    top2 = logits.topk(2).values
    return first, float(top2[0] - top2[1])


def assert_matches_reference(llm: LLM, prompts: list[str], expected: list[list[int]],
                             outputs: list[list[int]], label: str = "") -> None:
    """Each output equals its reference, or leaves it at a near-tie; at most one such output."""
    assert len(outputs) == len(expected) == len(prompts), (len(outputs), len(expected), len(prompts))
    near_ties = 0
    for index, (prompt, exp, got) in enumerate(zip(prompts, expected, outputs)):
        if got != exp:
            first, gap = divergence(llm, prompt, exp, got)
            shown = max(0, first - 2)
            where = (f"{len(got)} tokens for {len(exp)}" if first < 0 else
                     f"token {first}: expected {exp[shown:first + 3]}, got {got[shown:first + 3]} (from token "
                     f"{shown}), top-2 logit gap {gap:.2e}")
            assert gap < NEAR_TIE, f"{label} diverged from the reference without a near-tie: prompt {index}, {where}"
            near_ties += 1
    print(f"{label}: {near_ties} divergence(s) at near-ties (< {NEAR_TIE})")
    assert near_ties <= 1, f"{label}: {near_ties} near-tie divergences"
