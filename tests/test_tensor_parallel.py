"""Tensor parallelism: two gloo ranks (real processes) give the logits and tokens of one.

One spawn of two ranks runs every multi-rank scenario and saves what it saw; the same
scenarios run in this process without tensor parallelism, and the tests compare the two.
"""

from __future__ import annotations

import traceback
from pathlib import Path

import pytest
import torch

from concurrency import run_in_processes
from minedraft.config import RunnerConfig
from minedraft.model_runner import ForwardChunk, ModelRunner
from minedraft.parallel import TPGroup
from minedraft.sampling_params import SamplingParams
from minedraft.service.network import free_port
from minedraft.verifier import Verifier
from tp_helpers import TARGET

TP_SIZE = 2
TOL = 1e-4

pytest_plugins = ["tp_helpers"]  # tiny_checkpoint


def _tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, 1000, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _runner(path: Path, tp: TPGroup | None) -> ModelRunner:
    return ModelRunner(RunnerConfig(model_path=str(path), block_size=4, num_blocks=64), tp)


def _runner_script(runner: ModelRunner) -> list[torch.Tensor]:
    """Prefill chunk, ragged batch, decodes, a k + 1 verify, a rollback, a verify after it."""
    a, b, c = _tokens(24, 1), _tokens(12, 2), _tokens(5, 3)
    out = [runner.forward([ForwardChunk("a", a[:13], num_logits=13)])]
    out.append(runner.forward([ForwardChunk("b", b[:7], num_logits=2),
                               ForwardChunk("a", a[13:16], num_logits=3),
                               ForwardChunk("c", c, num_logits=5)]))
    for i in range(3):
        out.append(runner.forward([ForwardChunk("a", [a[16 + i]]), ForwardChunk("b", [b[7 + i]]),
                                   ForwardChunk("c", [a[i]])]))
    out.append(runner.forward([ForwardChunk("a", a[19:24], num_logits=5)]))      # verify k = 4
    runner.truncate("a", runner.length("a") - 3)                                  # 3 rejected
    out.append(runner.forward([ForwardChunk("a", _tokens(5, 4), num_logits=5),    # verify after it
                               ForwardChunk("b", b[10:12], num_logits=2)]))
    return out


def _prompt_lookup(tokens: list[int], k: int) -> list[int]:
    """Deterministic drafts: what followed the last earlier occurrence of the last token."""
    last = tokens[-1]
    for start in range(len(tokens) - 2, -1, -1):
        if tokens[start] == last:
            return tokens[start + 1:start + 1 + k]
    return []


def _generate(runner: ModelRunner, params: SamplingParams, steps: int) -> dict[str, list[int]]:
    """Verify steps for three prompts: k = 0 for the first half, prompt-lookup drafts after."""
    verifier = Verifier(runner)
    prompts = {f"g{i}": _tokens(n, 30 + i) for i, n in enumerate((9, 4, 15))}
    for i, (rid, prompt) in enumerate(prompts.items()):
        verifier.add_request(rid, prompt, params, seed=100 + i)
    output = {rid: list(prompt) for rid, prompt in prompts.items()}
    for step in range(steps):
        requests = [(rid, [] if step < steps // 2 else _prompt_lookup(tokens, 3))
                    for rid, tokens in output.items()]
        for (rid, _), new_tokens in zip(requests, verifier.verify(requests)):
            output[rid].extend(new_tokens)
    for rid in prompts:
        verifier.remove_request(rid)
    return output


def _scenarios(tiny: Path, tp: TPGroup | None) -> dict:
    target = _runner(TARGET, tp)
    tiny_runner = _runner(tiny, tp)
    return {
        "target": _runner_script(target),
        "tiny": _runner_script(tiny_runner),
        "greedy": _generate(target, SamplingParams(), steps=8),
        "sampled": _generate(target, SamplingParams(temperature=0.8, top_k=50), steps=6),
        "kv_cache_shape": tuple(target.kv_cache.storage.shape),
        "tiny_kv_cache_shape": tuple(tiny_runner.kv_cache.storage.shape),
    }


def _worker(rank: int, port: int, tiny: str, out_dir: str, results) -> None:
    try:
        torch.set_num_threads(1)
        tp = TPGroup.create(rank, TP_SIZE, "127.0.0.1", port, timeout_s=60)
        try:
            torch.save(_scenarios(Path(tiny), tp), Path(out_dir) / f"rank{rank}.pt")
        finally:
            tp.close()
        results.put((rank, "ok"))
    except Exception:
        results.put((rank, traceback.format_exc()))


@pytest.fixture(scope="module")
def single(tiny_checkpoint) -> dict:
    return _scenarios(tiny_checkpoint, None)


@pytest.fixture(scope="module")
def ranks(tiny_checkpoint, tmp_path_factory) -> list[dict]:
    """Every scenario at TP=2, once: [rank 0's results, rank 1's]."""
    out_dir = tmp_path_factory.mktemp("tp-results")
    port = free_port()
    jobs = [(_worker, (rank, port, str(tiny_checkpoint), str(out_dir))) for rank in range(TP_SIZE)]
    reports = dict(run_in_processes(jobs, timeout_s=120))
    assert all(status == "ok" for status in reports.values()), reports
    return [torch.load(out_dir / f"rank{rank}.pt") for rank in range(TP_SIZE)]


def _assert_logits_match(tp_logits: list[torch.Tensor], reference: list[torch.Tensor]) -> None:
    assert len(tp_logits) == len(reference)
    for step, (got, expected) in enumerate(zip(tp_logits, reference)):
        assert got.shape == expected.shape, step
        assert (got - expected).abs().max() < TOL, (step, (got - expected).abs().max())


@pytest.mark.parametrize("model", ["target", "tiny"])
def test_tp2_logits_equal_tp1(ranks, single, model) -> None:
    """target: kv heads split, tied head; tiny: kv head replicated, biases, padded vocab."""
    assert max(single[model][0].abs().max(), single[model][-1].abs().max()) > 1.0  # not trivially small
    _assert_logits_match(ranks[0][model], single[model])
    for a, b in zip(ranks[0][model], ranks[1][model]):       # every rank samples from the same logits
        assert torch.equal(a, b)


def test_tp2_kv_cache_holds_local_heads(ranks, single) -> None:
    layers, kv, slots, heads, head_dim = single["kv_cache_shape"]
    assert heads == 2 and ranks[0]["kv_cache_shape"] == (layers, kv, slots, 1, head_dim)
    assert single["tiny_kv_cache_shape"][3] == 1 and ranks[1]["tiny_kv_cache_shape"][3] == 1


def test_tp2_generation_equals_tp1(ranks, single) -> None:
    assert ranks[0]["greedy"] == single["greedy"]
    assert ranks[1]["greedy"] == single["greedy"]
    # Seeded sampling from bitwise-equal logits: the ranks agree token for token.
    assert ranks[0]["sampled"] == ranks[1]["sampled"]
    assert all(len(tokens) > 10 for tokens in single["greedy"].values())
