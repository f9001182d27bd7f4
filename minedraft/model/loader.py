"""Load a Hugging Face-format checkpoint (a directory, or a Hub id resolved by hub.py) into
`CausalLM`, whole or one rank's shard.

The model is built on the meta device (no memory), sharded there when tensor-parallel,
materialised once on its device in its dtype, and every checkpoint tensor is copied
straight from the memory-mapped safetensors file into its destination (or a slice of a
fused destination). A sharded weight is read only as this rank's slice: no copy of the
full weights exists at any point, on any rank. Bundled and real checkpoints take exactly
this path.
"""

from __future__ import annotations

import re
import zlib
from pathlib import Path

import torch
from safetensors import safe_open
from tqdm import tqdm

from minedraft.config import ModelConfig
from minedraft.model.hub import resolve_checkpoint
from minedraft.model.tensor_parallel import FUSED_PARTS, ShardPlan, shard_model
from minedraft.model.transformer import CausalLM
from minedraft.parallel import TPGroup

_LAYER_KEY = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_IGNORED = ("rotary_emb.inv_freq",)
_FUSED = {   # checkpoint module -> (our fused module, part)
    "self_attn.q_proj": ("attn.qkv_proj", "q"),
    "self_attn.k_proj": ("attn.qkv_proj", "k"),
    "self_attn.v_proj": ("attn.qkv_proj", "v"),
    "mlp.gate_proj": ("mlp.gate_up_proj", "gate"),
    "mlp.up_proj": ("mlp.gate_up_proj", "up"),
}
_PLAIN = {
    "self_attn.o_proj": "attn.o_proj", "self_attn.q_norm": "attn.q_norm",
    "self_attn.k_norm": "attn.k_norm", "mlp.down_proj": "mlp.down_proj",
    "input_layernorm": "input_layernorm", "post_attention_layernorm": "post_attention_layernorm",
}


def load_model(path: str | Path, dtype: torch.dtype, device: str | torch.device,
               random_weights: bool = False, tp: TPGroup | None = None, revision: str | None = None) -> CausalLM:
    """path: a checkpoint directory or a Hugging Face id (at `revision`, default main).
    tp: load rank tp.rank's shard of a tensor-parallel model (None or size 1: whole).

    random_weights: only config.json is read and the weights are drawn on the device, so
    real-size models can be timed where their checkpoints cannot be downloaded. Each
    parameter's draw is seeded by its name, so replicated parameters agree across ranks.
    """
    path = resolve_checkpoint(path, revision)
    cfg = ModelConfig.from_dir(path)
    rank, size = (tp.rank, tp.size) if tp is not None else (0, 1)
    plan = ShardPlan.build(cfg, rank, size)     # rejects an impossible split before any allocation
    with torch.device("meta"):
        model = CausalLM(cfg)
    if plan.size > 1:
        shard_model(model, tp)
    model = model.to(dtype=dtype).to_empty(device=device)
    if plan.size == 1:
        model.tie_weights()                     # a sharded head is untied for good
    model.rotary.cos_sin = torch.empty(cfg.max_position, 2, cfg.head_dim, device=device)
    model.rotary.compute_tables()
    with torch.no_grad():
        if plan.vocab_padded:
            model.lm_head.weight[plan.vocab_stop - plan.vocab_start:].zero_()
        if random_weights:
            _draw_random(model, plan)
        else:
            _load_checkpoint(model, path, plan)
    return model.eval()


def _draw_random(model: CausalLM, plan: ShardPlan) -> None:
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.fill_(1.0)
        elif name.endswith("bias"):
            param.zero_()
        else:
            generator = torch.Generator(param.device).manual_seed(zlib.crc32(name.encode()))
            param.normal_(0.0, 0.02, generator=generator)
    if model.cfg.tie_word_embeddings and plan.size > 1:
        _copy_tied_head(model, plan)


def _load_checkpoint(model: CausalLM, path: Path, plan: ShardPlan) -> None:
    cfg = model.cfg
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {path}")
    params = dict(model.named_parameters(remove_duplicate=False))
    filled: set[str] = set()
    # A progress bar on a terminal (a 32B checkpoint takes minutes), from one rank only.
    progress = tqdm(total=sum(f.stat().st_size for f in files), unit="B", unit_scale=True, leave=False,
                    desc=f"loading {path.name}", disable=None if plan.rank == 0 else True)
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for key in f.keys():
                if key.endswith(_IGNORED):
                    continue
                target = _destination(key)
                if target is None:
                    raise ValueError(f"{file.name}: unexpected tensor {key!r}")
                name, part = target
                if name == "lm_head.weight" and cfg.tie_word_embeddings:
                    continue
                index = plan.source_index(name, part)
                if index is None:                  # another rank's (a row-parallel bias)
                    continue
                if name not in params:
                    raise ValueError(f"{file.name}: tensor {key!r} has no place in a {cfg.family} "
                                     f"model with this config")
                rows = plan.destination_rows(name, part)
                dest = params[name] if rows is None else params[name][rows[0]:rows[1]]
                source = f.get_slice(key)[index]   # reads only this rank's slice
                if source.shape != dest.shape:
                    raise ValueError(f"{key}: checkpoint shape {tuple(source.shape)} "
                                     f"!= model shape {tuple(dest.shape)} (rank {plan.rank} of {plan.size})")
                dest.copy_(source)
                filled.add(_label(name, rows))
        progress.update(file.stat().st_size)
    progress.close()
    if cfg.tie_word_embeddings and plan.size > 1 and "embed_tokens.weight" in filled:
        _copy_tied_head(model, plan)
        filled.add(_label("lm_head.weight", plan.destination_rows("lm_head.weight", None)))
    _check_complete(model, plan, filled)


def _copy_tied_head(model: CausalLM, plan: ShardPlan) -> None:
    """A sharded tied head: its rows are this rank's slice of the embedding."""
    real = plan.vocab_stop - plan.vocab_start
    model.lm_head.weight[:real].copy_(model.embed_tokens.weight[plan.vocab_start:plan.vocab_stop])


def _destination(key: str) -> tuple[str, str | None] | None:
    """Checkpoint key -> (parameter name in our module, fused part or None)."""
    if key == "model.embed_tokens.weight":
        return "embed_tokens.weight", None
    if key == "model.norm.weight":
        return "norm.weight", None
    if key == "lm_head.weight":
        return "lm_head.weight", None
    match = _LAYER_KEY.match(key)
    if match is None:
        return None
    layer, rest = match.groups()
    prefix = f"layers.{layer}."
    module, _, leaf = rest.rpartition(".")
    if module in _FUSED:
        name, part = _FUSED[module]
        return prefix + name + "." + leaf, part
    if module in _PLAIN:
        return prefix + _PLAIN[module] + "." + leaf, None
    return None


def _label(name: str, rows: tuple[int, int] | None) -> str:
    return name if rows is None else f"{name}[{rows[0]}:{rows[1]}]"


def _check_complete(model: CausalLM, plan: ShardPlan, filled: set[str]) -> None:
    """Every local parameter (every slice of a fused one) must have come from the checkpoint."""
    expected: set[str] = set()
    for name, _ in model.named_parameters():
        module = name.rsplit(".", 2)[-2]
        for part in FUSED_PARTS.get(module, (None,)):
            expected.add(_label(name, plan.destination_rows(name, part)))
    missing = sorted(expected - filled)
    if missing:
        raise ValueError(f"checkpoint is missing {len(missing)} tensors, e.g. {missing[:3]}")
