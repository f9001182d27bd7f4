"""The runner's logits equal the transformers reference for every way a batch is formed."""

from __future__ import annotations

import pytest
import torch

from minedraft.config import RunnerConfig
from minedraft.kv_cache import OutOfBlocks
from minedraft.model_runner import ForwardChunk, ModelRunner

FAMILIES = ["qwen3", "qwen2", "llama"]
TOL = 1e-4


def _reference(path) -> "torch.nn.Module":
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _ref_logits(ref, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return ref(torch.tensor([tokens])).logits[0].float()


def _runner(path, num_blocks: int = 64) -> ModelRunner:
    return ModelRunner(RunnerConfig(model_path=str(path), dtype="float32", block_size=4, num_blocks=num_blocks))


def _tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, 211, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture(scope="module", params=FAMILIES)
def pair(request, tiny_checkpoints):
    path = tiny_checkpoints[request.param]
    return _reference(path), _runner(path)


def test_prefill_all_positions(pair):
    ref, runner = pair
    seq = _tokens(23, 1)
    ours = runner.forward([ForwardChunk("a", seq, num_logits=len(seq))])
    assert (ours - _ref_logits(ref, seq)).abs().max() < TOL
    runner.free("a")


def test_chunked_prefill_decode_and_verify(pair):
    ref, runner = pair
    seq = _tokens(30, 2)
    expected = _ref_logits(ref, seq)
    got = [runner.forward([ForwardChunk("b", seq[0:9], num_logits=9)]),       # prefill chunk 1
           runner.forward([ForwardChunk("b", seq[9:20], num_logits=11)]),     # prefill chunk 2
           runner.forward([ForwardChunk("b", seq[20:21])]),                   # decode
           runner.forward([ForwardChunk("b", seq[21:26], num_logits=5)]),     # k + 1 = 5 verify
           runner.forward([ForwardChunk("b", seq[26:30], num_logits=1)])]     # only the last logits
    assert (torch.cat(got[:4]) - expected[:26]).abs().max() < TOL
    assert (got[4][0] - expected[29]).abs().max() < TOL
    assert runner.length("b") == 30
    runner.free("b")


def test_rollback_then_new_tokens(pair):
    ref, runner = pair
    prompt, drafts, real = _tokens(13, 3), _tokens(5, 4), _tokens(4, 5)
    runner.forward([ForwardChunk("c", prompt)])
    runner.forward([ForwardChunk("c", drafts, num_logits=5)])
    runner.truncate("c", 15)                                   # keep 2 of 5 drafts
    assert runner.length("c") == 15
    ours = runner.forward([ForwardChunk("c", real, num_logits=4)])
    expected = _ref_logits(ref, prompt + drafts[:2] + real)[15:]
    assert (ours - expected).abs().max() < TOL
    runner.free("c")


def test_mixed_ragged_batch(pair):
    ref, runner = pair
    seqs = {rid: _tokens(n, 10 + i) for i, (rid, n) in enumerate([("p", 17), ("d", 12), ("v", 14), ("q", 6)])}
    runner.forward([ForwardChunk("d", seqs["d"][:11]), ForwardChunk("v", seqs["v"][:9])])
    ours = runner.forward([
        ForwardChunk("p", seqs["p"], num_logits=17),      # whole prefill
        ForwardChunk("d", seqs["d"][11:], num_logits=1),  # decode
        ForwardChunk("v", seqs["v"][9:], num_logits=5),   # verify k = 4
        ForwardChunk("q", seqs["q"][:3], num_logits=2),   # prefill chunk, logits for its last 2
    ])
    expected = torch.cat([
        _ref_logits(ref, seqs["p"]),
        _ref_logits(ref, seqs["d"])[11:],
        _ref_logits(ref, seqs["v"])[9:],
        _ref_logits(ref, seqs["q"][:3])[1:],
    ])
    assert ours.shape == expected.shape
    assert (ours - expected).abs().max() < TOL
    for rid in seqs:
        runner.free(rid)


def test_prefills_of_different_lengths_among_decodes(pair):
    """Decodes and prefills of different lengths interleaved in one batch: attention runs in
    groups of similar query length (gateway arrivals join decode batches so), and every row
    comes back in the batch's order."""
    from minedraft.model.attention import build_metadata

    ref, runner = pair
    plan = [("d1", 9, 1), ("long", 0, 20), ("d2", 5, 3), ("longer", 0, 40), ("mid", 0, 25), ("d3", 7, 1)]
    seqs = {rid: _tokens(ctx + new, 30 + i) for i, (rid, ctx, new) in enumerate(plan)}
    for rid, ctx, _ in plan:
        if ctx:
            runner.forward([ForwardChunk(rid, seqs[rid][:ctx])])
    chunks = [ForwardChunk(rid, seqs[rid][ctx:], num_logits=new) for rid, ctx, new in plan]
    meta = build_metadata([ctx for _, ctx, _ in plan], [new for *_, new in plan],
                          [torch.arange(ctx + new) for _, ctx, new in plan], torch.device("cpu"))
    assert sorted(g.num_requests for g in meta.groups) == [1, 1, 2, 2]    # 1 token; 3; 17-32; 33-64
    ours = runner.forward(chunks)
    expected = torch.cat([_ref_logits(ref, seqs[rid])[ctx:] for rid, ctx, _ in plan])
    assert (ours - expected).abs().max() < TOL
    for rid in seqs:
        runner.free(rid)


def test_blocks_return_and_out_of_blocks_is_atomic(tiny_checkpoints):
    runner = _runner(tiny_checkpoints["qwen3"], num_blocks=6)      # 24 slots
    free0 = runner.blocks.num_free_blocks
    runner.forward([ForwardChunk("x", _tokens(10, 6))])            # 3 blocks
    with pytest.raises(OutOfBlocks) as err:
        runner.forward([ForwardChunk("x", _tokens(3, 7)), ForwardChunk("y", _tokens(12, 8))])
    assert (err.value.needed, err.value.free) == (4, 3)           # x: 13 -> one more block, y: 3
    assert runner.length("x") == 10 and "y" not in runner.blocks   # nothing changed
    assert runner.blocks.num_free_blocks == free0 - 3
    runner.truncate("x", 3)                                        # rollback frees whole blocks
    assert runner.blocks.num_free_blocks == free0 - 1
    runner.free("x")
    assert runner.blocks.num_free_blocks == free0


def test_bad_chunks_are_rejected(tiny_checkpoints):
    runner = _runner(tiny_checkpoints["qwen3"])
    with pytest.raises(ValueError, match="no tokens"):
        runner.forward([ForwardChunk("e", [])])
    with pytest.raises(ValueError, match="num_logits"):
        runner.forward([ForwardChunk("e", [1, 2], num_logits=3)])
    with pytest.raises(ValueError, match="max_position"):
        runner.forward([ForwardChunk("e", [1] * 300)])


def test_bfloat16_runner_tracks_float32(tiny_checkpoints):
    """bfloat16 weights and KV cache: same argmax almost everywhere, logits close."""
    path = tiny_checkpoints["qwen3"]
    seq = _tokens(20, 21)
    full = _runner(path).forward([ForwardChunk("a", seq, num_logits=len(seq))])
    half_runner = ModelRunner(RunnerConfig(model_path=str(path), dtype="bfloat16", block_size=4, num_blocks=64))
    assert half_runner.kv_cache.storage.dtype == torch.bfloat16
    half = torch.cat([half_runner.forward([ForwardChunk("a", seq[:12], num_logits=12)]),
                      half_runner.forward([ForwardChunk("a", seq[12:], num_logits=8)])])
    assert half.dtype == torch.float32 and half.shape == full.shape
    assert (half - full).abs().max() < 0.1 * full.abs().max()
    assert (half.argmax(-1) == full.argmax(-1)).float().mean() >= 0.9


def test_a_kv_cache_larger_than_the_memory_available_is_refused_by_its_flag(tiny_checkpoints, monkeypatch):
    """Refused before a byte is allocated, naming --num-blocks; zeroed anyway, the cache would
    bring the kernel's OOM killer onto this process or another one on the host."""
    from minedraft import kv_cache

    assert kv_cache.available_memory(torch.device("cpu")) > 0          # read from /proc/meminfo
    runner = _runner(tiny_checkpoints["qwen3"], num_blocks=64)
    needed = runner.kv_cache.nbytes
    monkeypatch.setattr(kv_cache, "available_memory", lambda device: needed - 1)
    with pytest.raises(MemoryError, match=r"--num-blocks 64 \(--block-size 4\) needs .* lower --num-blocks"):
        _runner(tiny_checkpoints["qwen3"], num_blocks=64)
    monkeypatch.setattr(kv_cache, "available_memory", lambda device: needed)
    assert _runner(tiny_checkpoints["qwen3"], num_blocks=64).kv_cache.nbytes == needed
    monkeypatch.setattr(kv_cache, "available_memory", lambda device: None)      # unknown: not checked
    assert _runner(tiny_checkpoints["qwen3"], num_blocks=64).kv_cache.nbytes == needed
