"""One model instance with its paged KV cache: runs ragged batched forwards.

The runner decides *how* a forward runs; what runs (which requests, how many tokens) is
the caller's decision, handed over as `ForwardChunk`s. Each request contributes its own
number of new tokens (a prefill chunk, one decode token, k + 1 verification tokens) and
gets logits only at the positions it asks for.

Under tensor parallelism every rank of the group holds a runner over its shard and must
be handed the same calls in the same order; each returns the full-vocabulary logits, so
whatever samples from them runs identically on every rank.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from minedraft.config import ModelConfig, RunnerConfig
from minedraft.kv_cache import BlockManager, KVCache
from minedraft.model.attention import ATTENTION_BACKENDS, build_metadata
from minedraft.model.loader import load_model
from minedraft.model.packed_linear import (last_level_cache_bytes, linear_weight_bytes, pack_linears,
                                          packing_available, packing_pays)
from minedraft.parallel import TPGroup

logger = logging.getLogger("minedraft.model")


@dataclass(frozen=True)
class ForwardChunk:
    request_id: str
    token_ids: list[int]     # new tokens, appended after the request's cached positions
    num_logits: int = 1      # logits wanted for the last `num_logits` of them


class ModelRunner:
    def __init__(self, config: RunnerConfig, tp: TPGroup | None = None) -> None:
        """tp: this rank's tensor-parallel group; None runs the whole model here."""
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        if config.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(f"attention_backend must be one of {sorted(ATTENTION_BACKENDS)}, "
                             f"got {config.attention_backend!r}")
        self.config = config
        self.device = torch.device(config.device)
        self.tp = tp if tp is not None else TPGroup.single(self.device)
        if self.tp.size > 1 and not _same_device(self.tp.device, self.device):
            raise ValueError(f"tensor-parallel group is on {self.tp.device} but the runner on {self.device}")
        self.model = load_model(config.model_path, config.torch_dtype, self.device, config.random_weights,
                                tp=self.tp)
        self.model_config: ModelConfig = self.model.cfg
        self.packed = self._pack(config.packed_weights)
        self.attention = ATTENTION_BACKENDS[config.attention_backend]
        cfg = self.model_config
        local_kv_heads = self.model.layers[0].attn.num_kv_heads     # this rank's share
        # The cache first: it refuses a size the memory cannot hold before the block list is built.
        self.kv_cache = KVCache(cfg.num_layers, config.num_blocks, config.block_size,
                                local_kv_heads, cfg.head_dim, config.torch_dtype, self.device)
        self.blocks = BlockManager(config.num_blocks, config.block_size)
        self._cached_tokens: dict[str, list[int]] = {}

    def _pack(self, packed_weights: str) -> bool:
        """Pack the linear weights for oneDNN where that pays (or as configured). -> whether packed."""
        dtype = self.config.torch_dtype
        if packed_weights == "on" and not packing_available(self.device, dtype):
            raise ValueError(f"packed_weights 'on': packed weights are for float32 on CPU with oneDNN, "
                             f"not {self.config.dtype} on {self.device}")
        if packed_weights == "off" or (packed_weights == "auto" and not packing_pays(self.model, self.device, dtype)):
            return False
        weights = linear_weight_bytes(self.model)
        logger.info("%d linear layers' weights packed for oneDNN (%.0f MB of them; the last-level cache holds %.0f MB)",
                    pack_linears(self.model), weights / 2**20, last_level_cache_bytes() / 2**20)
        return True

    @property
    def vocab_size(self) -> int:
        return self.model_config.vocab_size

    def length(self, request_id: str) -> int:
        """Positions of this request whose KV is cached."""
        return self.blocks.length(request_id)

    def cached_tokens(self, request_id: str) -> list[int]:
        """Token ids whose KV is cached for this request, in position order."""
        return self._cached_tokens.get(request_id, [])

    def truncate(self, request_id: str, length: int) -> None:
        """Drop cached positions >= length (no copy: blocks past the end are freed)."""
        self.blocks.truncate(request_id, length)
        del self._cached_tokens[request_id][length:]

    def reconcile(self, request_id: str, verified_tokens: list[int]) -> int:
        """Keep only the cached prefix that agrees with the verified tokens; -> kept length.

        The one place rejected drafts leave a cache: whatever follows the first position
        where cached and verified tokens differ (or where the verified ones end) is dropped.
        """
        cached = self._cached_tokens.get(request_id)
        if cached is None:
            return 0
        limit = min(len(cached), len(verified_tokens))
        if cached[:limit] == verified_tokens[:limit]:       # the usual case: nothing rejected
            keep = limit
        else:
            # First mismatch by bisection on slice equality: a handful of C-level compares
            # instead of a Python loop over the whole context, on every step.
            keep, bad = 0, limit                           # prefix `keep` agrees, prefix `bad` does not
            while bad - keep > 1:
                mid = (keep + bad) // 2
                if cached[keep:mid] == verified_tokens[keep:mid]:
                    keep = mid
                else:
                    bad = mid
        if keep < len(cached):
            self.truncate(request_id, keep)
        return keep

    def free(self, request_id: str) -> None:
        self.blocks.free(request_id)
        self._cached_tokens.pop(request_id, None)

    @torch.inference_mode()
    def forward(self, chunks: list[ForwardChunk]) -> torch.Tensor:
        """-> logits [sum(num_logits), vocab] float32, in chunk order.

        Raises `OutOfBlocks` before touching any state if the cache cannot hold the batch.
        """
        if not chunks:
            raise ValueError("forward needs at least one chunk")
        context_lens = [self.blocks.length(c.request_id) for c in chunks]
        new_lens = [len(c.token_ids) for c in chunks]
        for chunk, ctx, new in zip(chunks, context_lens, new_lens):
            if new == 0:
                raise ValueError(f"request {chunk.request_id!r}: chunk has no tokens")
            if not 1 <= chunk.num_logits <= new:
                raise ValueError(f"request {chunk.request_id!r}: num_logits must be in 1..{new}")
            if ctx + new > self.model_config.max_position:
                raise ValueError(f"request {chunk.request_id!r}: length {ctx + new} exceeds "
                                 f"max_position {self.model_config.max_position}")
        self.blocks.grow({c.request_id: ctx + new for c, ctx, new in zip(chunks, context_lens, new_lens)})

        for chunk in chunks:
            self._cached_tokens.setdefault(chunk.request_id, []).extend(chunk.token_ids)
        slots = [self.blocks.slots(c.request_id, ctx + new)
                 for c, ctx, new in zip(chunks, context_lens, new_lens)]
        meta = build_metadata(context_lens, new_lens, slots, self.device, self.config.torch_dtype)
        input_ids: list[int] = []
        positions: list[int] = []
        logits_rows: list[int] = []
        for chunk, ctx, new in zip(chunks, context_lens, new_lens):
            start = len(input_ids)
            input_ids.extend(chunk.token_ids)
            positions.extend(range(ctx, ctx + new))
            logits_rows.extend(range(start + new - chunk.num_logits, start + new))
        return self.model(
            torch.tensor(input_ids, dtype=torch.int64, device=self.device),
            torch.tensor(positions, dtype=torch.int64, device=self.device),
            self.kv_cache.layers, meta,
            torch.tensor(logits_rows, dtype=torch.int64, device=self.device),
            self.attention,
        )


def _same_device(a: torch.device, b: torch.device) -> bool:
    """An unset index matches any: 'cuda' and 'cuda:0' may name the same device."""
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)
