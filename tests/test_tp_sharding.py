"""Sharding a model for tensor parallelism, without processes or communication: which splits
a shard plan accepts, which slices of the checkpoint each rank takes, the local shapes of a
sharded model, and what the loader reads for each rank."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from tp_helpers import TARGET, TINY

from minedraft.config import ModelConfig
from minedraft.model.loader import load_model
from minedraft.model.tensor_parallel import ShardPlan, shard_model
from minedraft.model.transformer import CausalLM
from minedraft.parallel import TPGroup

pytest_plugins = ["tp_helpers"]  # tiny_checkpoint


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
