"""Tensor parallelism (Megatron style), applied to a built `CausalLM` (gpt-fast `tp.py`).

The model code knows nothing of this module: `shard_model` swaps in smaller `nn.Linear`s,
adjusts the attention and MLP size attributes and adds forward hooks for the collectives,
all while the model is still on the meta device, so no rank ever holds the full weights.
The loader then copies each rank's slice out of the checkpoint (`ShardPlan.source_index`).

Split (each rank computes its share, no communication inside the block):
- attention heads. qkv_proj is column-parallel: each rank projects its own query heads and
  the kv heads they read, and attends over them alone (attention is independent per head).
  o_proj is row-parallel: its input dim is this rank's heads, and the partial outputs are
  summed by one all-reduce. KV heads are split like the query heads when they divide
  evenly; when there are fewer KV heads than ranks, each rank keeps (replicates) the one
  KV head its query heads use. The KV cache then holds only local KV heads.
- MLP columns. gate_up_proj is column-parallel (SiLU(gate) * up is elementwise, so a
  slice of the intermediate columns needs nothing from other ranks); down_proj is
  row-parallel with one all-reduce. So a layer costs two all-reduces of [T, hidden].
- the LM head over the vocabulary (column-parallel: one of the largest matmuls),
  logits all-gathered so every rank holds the full row and runs the sampler identically.
  The vocabulary is padded with zero rows to a multiple of the size and trimmed after the
  gather, so any vocabulary works. A tied head is untied: its rows are a copy of the
  embedding rows of this rank's vocabulary slice.

Replicated:
- the embedding: a lookup is cheap and needs no communication when every rank holds the
  whole table (a vocabulary-split embedding would cost one more all-reduce per forward);
- RMSNorms, q/k norms and rotary tables: tiny, and they act on the full hidden state (or
  per head) that every rank holds after each all-reduce.

Row-parallel biases (o_proj, down_proj) live on rank 0 only, so each is added exactly once
by the all-reduce; other ranks build those layers without a bias.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from minedraft.config import ModelConfig
from minedraft.model.transformer import CausalLM
from minedraft.parallel import TPGroup

FUSED_PARTS = {"qkv_proj": ("q", "k", "v"), "gate_up_proj": ("gate", "up")}


@dataclass(frozen=True)
class ShardPlan:
    """This rank's share of every weight; size 1 is the whole model."""

    rank: int
    size: int
    head_dim: int
    num_heads: int              # local query heads
    num_kv_heads: int           # local KV heads
    q_head_start: int           # first global query head on this rank
    kv_head_start: int          # first global KV head on this rank
    intermediate_size: int      # local MLP columns
    vocab_size: int             # the model's (unpadded) vocabulary
    vocab_per_rank: int         # LM-head rows on each rank, padding included
    vocab_start: int            # first vocabulary row of this rank's LM-head shard
    vocab_stop: int             # one past its last real row; rows after it are padding

    @staticmethod
    def build(cfg: ModelConfig, rank: int, size: int) -> ShardPlan:
        """Validates that the model splits over `size` ranks; raises ValueError if not."""
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"tensor-parallel size must be an int >= 1, got {size!r}")
        if not isinstance(rank, int) or not 0 <= rank < size:
            raise ValueError(f"rank must be in 0..{size - 1}, got {rank!r}")
        heads, kv_heads = cfg.num_heads, cfg.num_kv_heads
        if heads % size:
            raise ValueError(f"tensor-parallel size {size} must divide the {heads} attention heads")
        if heads % kv_heads:
            raise ValueError(f"{heads} attention heads are not a multiple of {kv_heads} KV heads")
        if cfg.intermediate_size % size:
            raise ValueError(f"tensor-parallel size {size} must divide the MLP intermediate size "
                             f"{cfg.intermediate_size}")
        local_heads = heads // size
        q_head_start = rank * local_heads
        if kv_heads % size == 0:                # split the KV heads like the query heads
            local_kv_heads, kv_head_start = kv_heads // size, rank * (kv_heads // size)
        elif size % kv_heads == 0:              # fewer KV heads than ranks: keep the one we read
            local_kv_heads, kv_head_start = 1, q_head_start // (heads // kv_heads)
        else:
            raise ValueError(f"{kv_heads} KV heads can be neither split over nor replicated across "
                             f"{size} ranks: one of the two must divide the other")
        vocab_per_rank = -(-cfg.vocab_size // size)
        vocab_start = min(rank * vocab_per_rank, cfg.vocab_size)
        return ShardPlan(
            rank=rank, size=size, head_dim=cfg.head_dim, num_heads=local_heads,
            num_kv_heads=local_kv_heads, q_head_start=q_head_start, kv_head_start=kv_head_start,
            intermediate_size=cfg.intermediate_size // size, vocab_size=cfg.vocab_size,
            vocab_per_rank=vocab_per_rank, vocab_start=vocab_start,
            vocab_stop=min(vocab_start + vocab_per_rank, cfg.vocab_size))

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def holds_row_parallel_bias(self) -> bool:
        """Rank 0 adds the bias of o_proj / down_proj once, before the all-reduce."""
        return self.rank == 0

    @property
    def vocab_padded(self) -> bool:
        """Whether this rank's LM-head shard ends in zero padding rows."""
        return self.vocab_stop - self.vocab_start < self.vocab_per_rank

    def fused_rows(self, part: str) -> tuple[int, int]:
        """Local rows of a fused parameter that checkpoint part q|k|v (qkv_proj) or
        gate|up (gate_up_proj) fills."""
        q, kv, inter = self.q_size, self.kv_size, self.intermediate_size
        rows = {"q": (0, q), "k": (q, q + kv), "v": (q + kv, q + 2 * kv),
                "gate": (0, inter), "up": (inter, 2 * inter)}
        if part not in rows:
            raise ValueError(f"unknown fused part {part!r}")
        return rows[part]

    def destination_rows(self, name: str, part: str | None) -> tuple[int, int] | None:
        """Local rows of parameter `name` that its checkpoint tensor (or fused part) fills;
        None: the whole parameter."""
        if part is not None:
            return self.fused_rows(part)
        if name == "lm_head.weight" and self.vocab_padded:
            return 0, self.vocab_stop - self.vocab_start
        return None

    def source_index(self, name: str, part: str | None) -> tuple[slice, ...] | None:
        """The index into the full checkpoint tensor of parameter `name` (fused `part`) that
        this rank loads; None when this rank holds none of it. Works on torch tensors and
        on safetensors' lazy slices alike, so only the slice is ever read."""
        hd, everything = self.head_dim, slice(None)
        heads = slice(self.q_head_start * hd, (self.q_head_start + self.num_heads) * hd)
        columns = slice(self.rank * self.intermediate_size, (self.rank + 1) * self.intermediate_size)
        if part == "q":
            return (heads,)
        if part in ("k", "v"):
            return (slice(self.kv_head_start * hd, (self.kv_head_start + self.num_kv_heads) * hd),)
        if part in ("gate", "up"):
            return (columns,)
        if part is not None:
            raise ValueError(f"unknown fused part {part!r}")
        if name.endswith(("o_proj.bias", "down_proj.bias")):
            return (everything,) if self.holds_row_parallel_bias else None
        if name.endswith("o_proj.weight"):
            return everything, heads
        if name.endswith("down_proj.weight"):
            return everything, columns
        if name == "lm_head.weight":
            return (slice(self.vocab_start, self.vocab_stop),)
        return (everything,)


def shard_model(model: CausalLM, tp: TPGroup) -> None:
    """Shard a meta-device model in place for rank tp.rank of tp.size; no-op for size 1."""
    if tp.size == 1:
        return
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if tensor.device.type != "meta":
            raise ValueError(f"shard_model needs the model on the meta device (built, not loaded); "
                             f"{name} is on {tensor.device}")
    cfg = model.cfg
    if any(layer.attn.num_heads != cfg.num_heads for layer in model.layers):
        raise ValueError("shard_model: the model is already sharded")
    plan = ShardPlan.build(cfg, tp.rank, tp.size)
    all_reduce = _all_reduce_hook(tp)
    for layer in model.layers:
        attn, mlp = layer.attn, layer.mlp
        attn.num_heads, attn.num_kv_heads = plan.num_heads, plan.num_kv_heads
        attn.q_size, attn.kv_size = plan.q_size, plan.kv_size
        attn.qkv_proj = _linear(cfg.hidden_size, plan.q_size + 2 * plan.kv_size,
                                attn.qkv_proj.bias is not None, attn.qkv_proj)
        attn.o_proj = _row_parallel(plan.q_size, cfg.hidden_size, attn.o_proj, plan)
        attn.o_proj.register_forward_hook(all_reduce)
        mlp.intermediate = plan.intermediate_size
        mlp.gate_up_proj = _linear(cfg.hidden_size, 2 * plan.intermediate_size,
                                   mlp.gate_up_proj.bias is not None, mlp.gate_up_proj)
        mlp.down_proj = _row_parallel(plan.intermediate_size, cfg.hidden_size, mlp.down_proj, plan)
        mlp.down_proj.register_forward_hook(all_reduce)
    # A new parameter: unties the head from the embedding, which stays whole on every rank.
    model.lm_head = _linear(cfg.hidden_size, plan.vocab_per_rank, False, model.lm_head)
    model.lm_head.register_forward_hook(_gather_vocab_hook(tp, plan))


def _linear(in_features: int, out_features: int, bias: bool, like: nn.Linear) -> nn.Linear:
    return nn.Linear(in_features, out_features, bias=bias, device="meta", dtype=like.weight.dtype)


def _row_parallel(in_features: int, out_features: int, like: nn.Linear, plan: ShardPlan) -> nn.Linear:
    bias = like.bias is not None and plan.holds_row_parallel_bias
    return _linear(in_features, out_features, bias, like)


def _all_reduce_hook(tp: TPGroup) -> Callable:
    def hook(module: nn.Module, args: tuple, partial_sum: torch.Tensor) -> torch.Tensor:
        return tp.all_reduce(partial_sum)
    return hook


def _gather_vocab_hook(tp: TPGroup, plan: ShardPlan) -> Callable:
    padded = plan.vocab_per_rank * plan.size != plan.vocab_size

    def hook(module: nn.Module, args: tuple, local_logits: torch.Tensor) -> torch.Tensor:
        logits = tp.all_gather_last(local_logits)                 # [N, vocab_per_rank * size]
        return logits[..., :plan.vocab_size].contiguous() if padded else logits
    return hook
