"""Tensor parallelism: two gloo ranks (real processes) give the logits and tokens of one.

One spawn of two ranks runs every multi-rank scenario and saves what it saw; the same
scenarios run in this process without tensor parallelism, and the tests compare the two.
"""

from __future__ import annotations

import json
import traceback
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from concurrency import run_in_processes
from minedraft.config import ModelConfig, RunnerConfig
from minedraft.model.loader import load_model
from minedraft.model.tensor_parallel import ShardPlan, shard_model
from minedraft.model.transformer import CausalLM
from minedraft.model_runner import ForwardChunk, ModelRunner
from minedraft.parallel import TPGroup
from minedraft.sampling_params import SamplingParams
from minedraft.service.network import free_port
from minedraft.verifier import Verifier

TARGET = Path(__file__).resolve().parents[1] / "minedraft" / "bundled" / "target"
TP_SIZE = 2
TOL = 1e-4
# llama with q/k/v, o_proj and MLP biases (row-parallel biases), one KV head (replicated
# over two ranks), an odd vocabulary (padded LM head) and an untied head.
TINY = dict(model_type="llama", vocab_size=1001, hidden_size=64, intermediate_size=96,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
            max_position_embeddings=128, rms_norm_eps=1e-6, attention_bias=True, mlp_bias=True,
            tie_word_embeddings=False, rope_theta=10000.0)


def _tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, 1000, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _save_tiny_checkpoint(out: Path) -> Path:
    """An HF-format llama checkpoint written key by key (no transformers needed)."""
    out.mkdir(parents=True, exist_ok=True)
    cfg = ModelConfig.from_dict(TINY)
    gen = torch.Generator().manual_seed(7)
    hidden, hd, inter = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    q, kv = cfg.num_heads * hd, cfg.num_kv_heads * hd

    def randn(*shape: int, scale: float = 0.15) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * scale

    tensors = {"model.embed_tokens.weight": randn(cfg.vocab_size, hidden, scale=1.0),
               "model.norm.weight": 1 + randn(hidden, scale=0.1),
               "lm_head.weight": randn(cfg.vocab_size, hidden)}
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        shapes = {"self_attn.q_proj": (q, hidden), "self_attn.k_proj": (kv, hidden),
                  "self_attn.v_proj": (kv, hidden), "self_attn.o_proj": (hidden, q),
                  "mlp.gate_proj": (inter, hidden), "mlp.up_proj": (inter, hidden),
                  "mlp.down_proj": (hidden, inter)}
        for module, shape in shapes.items():
            tensors[p + module + ".weight"] = randn(*shape)
            tensors[p + module + ".bias"] = randn(shape[0], scale=0.3)
        tensors[p + "input_layernorm.weight"] = 1 + randn(hidden, scale=0.1)
        tensors[p + "post_attention_layernorm.weight"] = 1 + randn(hidden, scale=0.1)
    save_file(tensors, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(TINY))
    return out


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
def tiny_checkpoint(tmp_path_factory) -> Path:
    return _save_tiny_checkpoint(tmp_path_factory.mktemp("tp") / "tiny-llama")


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


# ----------------------------------------------------------------------------- no processes


def _cfg(**overrides) -> ModelConfig:
    return ModelConfig.from_dict({**TINY, **overrides})


@pytest.mark.parametrize("overrides, size, match", [
    (dict(num_attention_heads=6, num_key_value_heads=2), 4, "must divide the 6 attention heads"),
    (dict(num_attention_heads=12, num_key_value_heads=3, hidden_size=96), 2,
     "3 KV heads can be neither split over nor replicated across 2 ranks"),
    (dict(intermediate_size=99), 2, "must divide the MLP intermediate size 99"),
    (dict(), 0, "size must be an int >= 1"),
])
def test_shard_plan_rejects_impossible_splits(overrides, size, match) -> None:
    with pytest.raises(ValueError, match=match):
        ShardPlan.build(_cfg(**overrides), 0, size)


def test_shard_plan_slices_cover_the_checkpoint() -> None:
    """Concatenating every rank's slice gives back the full tensor; one KV head is shared."""
    cfg = _cfg(num_attention_heads=8, num_key_value_heads=4, hidden_size=128)
    full = torch.randn(cfg.num_heads * cfg.head_dim, cfg.hidden_size)
    plans = [ShardPlan.build(cfg, rank, 4) for rank in range(4)]
    q_slices = [full[p.source_index("layers.0.attn.qkv_proj.weight", "q")] for p in plans]
    assert torch.equal(torch.cat(q_slices), full)
    o_proj = full.T
    assert torch.equal(torch.cat([o_proj[p.source_index("layers.0.attn.o_proj.weight", None)]
                                  for p in plans], dim=1), o_proj)
    assert [p.kv_head_start for p in plans] == [0, 1, 2, 3]
    replicated = [ShardPlan.build(_cfg(), rank, 4) for rank in range(4)]    # 4 heads, 1 KV head
    assert [(p.num_kv_heads, p.kv_head_start) for p in replicated] == [(1, 0)] * 4
    two_kv = [ShardPlan.build(_cfg(num_key_value_heads=2), rank, 4) for rank in range(4)]
    assert [p.kv_head_start for p in two_kv] == [0, 0, 1, 1]
    vocab = [ShardPlan.build(_cfg(), rank, 2) for rank in range(2)]         # 1001 = 501 + 500
    assert [(p.vocab_start, p.vocab_stop, p.vocab_padded) for p in vocab] == [(0, 501, False),
                                                                              (501, 1001, True)]
    assert [p.source_index("layers.1.mlp.down_proj.bias", None) for p in vocab] == [(slice(None),), None]


@pytest.mark.parametrize("rank", [0, 1])
def test_shard_model_local_shapes(rank) -> None:
    cfg = _cfg()
    with torch.device("meta"):
        model = CausalLM(cfg)
    shard_model(model, SimpleNamespace(rank=rank, size=2))       # only rank and size are read here
    attn, mlp = model.layers[0].attn, model.layers[0].mlp
    assert (attn.num_heads, attn.num_kv_heads, attn.q_size, attn.kv_size) == (2, 1, 32, 16)
    assert attn.qkv_proj.weight.shape == (64, 64) and attn.qkv_proj.bias.shape == (64,)
    assert attn.o_proj.weight.shape == (64, 32) and (attn.o_proj.bias is not None) == (rank == 0)
    assert mlp.intermediate == 48 and mlp.gate_up_proj.weight.shape == (96, 64)
    assert mlp.down_proj.weight.shape == (64, 48) and (mlp.down_proj.bias is not None) == (rank == 0)
    assert model.lm_head.weight.shape == (501, 64) and model.embed_tokens.weight.shape == (1001, 64)
    assert attn.o_proj._forward_hooks and mlp.down_proj._forward_hooks and model.lm_head._forward_hooks
    with pytest.raises(ValueError, match="already sharded"):             # hooks would run twice
        shard_model(model, SimpleNamespace(rank=rank, size=2))


def test_loader_reads_each_ranks_slice(tiny_checkpoint) -> None:
    """Without communication: each rank's parameters are its slices of the whole model's."""
    full = load_model(tiny_checkpoint, torch.float32, "cpu")
    shards = [load_model(tiny_checkpoint, torch.float32, "cpu", tp=SimpleNamespace(rank=rank, size=2))
              for rank in range(2)]
    qkv, gate_up = full.layers[1].attn.qkv_proj, full.layers[1].mlp.gate_up_proj
    for rank, shard in enumerate(shards):
        attn, mlp = shard.layers[1].attn, shard.layers[1].mlp
        heads, inter = slice(32 * rank, 32 * (rank + 1)), slice(48 * rank, 48 * (rank + 1))
        assert torch.equal(attn.qkv_proj.weight[:32], qkv.weight[heads])
        assert torch.equal(attn.qkv_proj.bias[32:], qkv.bias[64:])          # the one KV head, on both
        assert torch.equal(attn.o_proj.weight, full.layers[1].attn.o_proj.weight[:, heads])
        assert torch.equal(mlp.gate_up_proj.weight[48:], gate_up.weight[96:][inter])
        assert torch.equal(mlp.down_proj.weight, full.layers[1].mlp.down_proj.weight[:, inter])
        assert torch.equal(shard.embed_tokens.weight, full.embed_tokens.weight)
    assert torch.equal(shards[0].layers[0].mlp.down_proj.bias, full.layers[0].mlp.down_proj.bias)
    head = torch.cat([shard.lm_head.weight for shard in shards])
    assert torch.equal(head[:1001], full.lm_head.weight) and not head[1001:].any()


def test_random_weights_agree_where_replicated() -> None:
    shards = [load_model(TARGET, torch.float32, "cpu", random_weights=True,
                         tp=SimpleNamespace(rank=rank, size=2)) for rank in range(2)]
    assert torch.equal(shards[0].embed_tokens.weight, shards[1].embed_tokens.weight)
    for rank, shard in enumerate(shards):                     # tied: the head is the embedding's slice
        assert torch.equal(shard.lm_head.weight, shard.embed_tokens.weight[1536 * rank:1536 * (rank + 1)])
    again = load_model(TARGET, torch.float32, "cpu", random_weights=True)
    assert torch.equal(again.embed_tokens.weight, shards[0].embed_tokens.weight)


def test_shard_model_refuses_a_loaded_model_and_size_one_adds_nothing(tiny_checkpoint) -> None:
    model = load_model(tiny_checkpoint, torch.float32, "cpu")
    with pytest.raises(ValueError, match="meta device"):
        shard_model(model, SimpleNamespace(rank=0, size=2))
    shard_model(model, TPGroup.single())
    assert not any(module._forward_hooks for module in model.modules())


def test_single_group_collectives_are_identities() -> None:
    tp = TPGroup.single()
    assert (tp.rank, tp.size, tp.is_driver, tp.device) == (0, 1, True, torch.device("cpu"))
    t = torch.randn(3, 5)
    assert tp.all_reduce(t) is t and tp.all_gather_last(t) is t and tp.broadcast(t) is t
    assert tp.broadcast_bytes(b"step") == b"step"
    with pytest.raises(ValueError, match="driver"):
        tp.broadcast_bytes(None)
    tp.close()


@pytest.mark.parametrize("kwargs, match", [
    (dict(rank=2, size=2), "rank must be an int in 0..1"),
    (dict(rank=0, size=0), "size must be an int >= 1"),
    (dict(rank=0, size=2, backend="mpi"), "backend must be one of"),
    (dict(rank=0, size=2, backend="nccl"), "needs a cuda device"),
    (dict(rank=0, size=2, port=0), "port must be an int in 1..65535"),
])
def test_tp_group_rejects_bad_arguments(kwargs, match) -> None:
    kwargs = {"host": "127.0.0.1", "port": 29999, **kwargs}
    with pytest.raises(ValueError, match=match):
        TPGroup.create(**kwargs)
