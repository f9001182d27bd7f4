"""Attention over the paged KV cache, behind one small interface.

The model's linear layers run on the flattened ragged batch ([T, ...], no padding). Only
the attention kernel sees per-request structure, through `AttentionMetadata`, built once
per forward and shared by all layers. A fused GPU kernel (flash/paged attention) slots in
as another `AttentionBackend` reading the same metadata.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor   # [T] int64: cache slot of each new token
    query_index: torch.Tensor    # [B, max_new] int64: row of T for each (request, new token); padding -> 0
    key_slots: torch.Tensor      # [B, max_ctx] int64: cache slot of each (request, position); padding -> 0
    mask: torch.Tensor | None    # [B, 1, max_new, max_ctx] additive float (0 or -inf); None when not needed
    output_index: torch.Tensor   # [T] int64: row of the flattened [B * max_new] output for each token
    num_requests: int
    max_new: int


class AttentionBackend(Protocol):
    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                 scale: float) -> torch.Tensor: ...


def build_metadata(context_lens: list[int], new_lens: list[int], slots: list[torch.Tensor],
                   device: torch.device, dtype: torch.dtype = torch.float32) -> AttentionMetadata:
    """context_lens: tokens already cached per request; new_lens: tokens added now;
    slots[i]: cache slot of every position 0 .. context_lens[i] + new_lens[i] - 1."""
    num_requests = len(new_lens)
    max_new = max(new_lens)
    total_lens = [c + n for c, n in zip(context_lens, new_lens)]
    max_ctx = max(total_lens)
    query_index = torch.zeros(num_requests, max_new, dtype=torch.int64)
    key_slots = torch.zeros(num_requests, max_ctx, dtype=torch.int64)
    output_index: list[int] = []
    slot_mapping: list[torch.Tensor] = []
    start = 0
    for i, (ctx, new, seq_slots) in enumerate(zip(context_lens, new_lens, slots)):
        query_index[i, :new] = torch.arange(start, start + new)
        key_slots[i, :ctx + new] = seq_slots
        output_index.extend(range(i * max_new, i * max_new + new))
        slot_mapping.append(seq_slots[ctx:ctx + new])
        start += new
    mask = None
    needs_mask = max_new > 1 or any(t != max_ctx for t in total_lens)
    if needs_mask:
        ctx_t = torch.tensor(context_lens).view(-1, 1, 1)
        total_t = torch.tensor(total_lens).view(-1, 1, 1)
        query_pos = ctx_t + torch.arange(max_new).view(1, -1, 1)      # [B, max_new, 1]
        key_pos = torch.arange(max_ctx).view(1, 1, -1)                # [1, 1, max_ctx]
        allowed = ((key_pos <= query_pos) & (key_pos < total_t)).unsqueeze(1)
        mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, float("-inf")).to(device)
    return AttentionMetadata(
        slot_mapping=torch.cat(slot_mapping).to(device),
        query_index=query_index.to(device), key_slots=key_slots.to(device), mask=mask,
        output_index=torch.tensor(output_index, dtype=torch.int64, device=device),
        num_requests=num_requests, max_new=max_new,
    )


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                   scale: float) -> torch.Tensor:
    """q [T, H, D], k/v [T, Hkv, D], k_cache/v_cache [num_slots, Hkv, D] -> [T, H * D].

    Writes the new keys and values into their slots, gathers each request's whole context
    and runs one `scaled_dot_product_attention` for the batch.
    """
    k_cache.index_copy_(0, meta.slot_mapping, k)
    v_cache.index_copy_(0, meta.slot_mapping, v)
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k.shape[1]
    group = num_heads // num_kv_heads
    batch, max_new = meta.num_requests, meta.max_new
    # Grouped-query attention without copying K/V per query head: the `group` query heads
    # that share a KV head are stacked along the query axis (head h uses KV head h // group).
    # index_select on flattened indices is several times faster than advanced indexing.
    max_ctx = meta.key_slots.shape[1]
    q_batched = (q.index_select(0, meta.query_index.flatten())        # [B * max_new, H, D]
                 .view(batch, max_new, num_kv_heads, group, head_dim)
                 .permute(0, 2, 3, 1, 4)
                 .reshape(batch, num_kv_heads, group * max_new, head_dim))
    key_slots = meta.key_slots.flatten()
    k_batched = k_cache.index_select(0, key_slots).view(batch, max_ctx, num_kv_heads, head_dim).transpose(1, 2)
    v_batched = v_cache.index_select(0, key_slots).view(batch, max_ctx, num_kv_heads, head_dim).transpose(1, 2)
    mask = meta.mask
    if mask is not None and group > 1:                                # [B, 1, group * max_new, max_ctx]
        mask = mask.unsqueeze(2).expand(batch, 1, group, max_new, mask.shape[-1]).reshape(
            batch, 1, group * max_new, mask.shape[-1])
    out = F.scaled_dot_product_attention(q_batched, k_batched, v_batched, attn_mask=mask, scale=scale)
    out = (out.view(batch, num_kv_heads, group, max_new, head_dim)
           .permute(0, 3, 1, 2, 4)                                    # [B, max_new, Hkv, group, D]
           .reshape(batch * max_new, num_heads * head_dim))
    return out.index_select(0, meta.output_index)


ATTENTION_BACKENDS: dict[str, AttentionBackend] = {"sdpa": sdpa_attention}
