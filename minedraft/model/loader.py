"""Load a Hugging Face-format checkpoint directory into `CausalLM`.

The model is built on the meta device (no memory), materialised once on its device in its
dtype, and every checkpoint tensor is copied straight from the memory-mapped safetensors
file into its destination (or a slice of a fused destination): no second copy of the
weights exists at any point. Bundled and real checkpoints take exactly this path.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from safetensors import safe_open

from minedraft.config import ModelConfig
from minedraft.model.transformer import CausalLM

_LAYER_KEY = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_IGNORED = ("rotary_emb.inv_freq",)


def load_model(path: str | Path, dtype: torch.dtype, device: str | torch.device,
               random_weights: bool = False) -> CausalLM:
    """random_weights: only config.json is read and the weights are drawn on the device, so
    real-size models can be timed where their checkpoints cannot be downloaded."""
    path = Path(path)
    cfg = ModelConfig.from_dir(path)
    with torch.device("meta"):
        model = CausalLM(cfg)
    model = model.to(dtype=dtype).to_empty(device=device)
    model.tie_weights()
    model.rotary.cos_sin = torch.empty(cfg.max_position, 2, cfg.head_dim, device=device)
    model.rotary.compute_tables()
    if random_weights:
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith("norm.weight"):
                    param.fill_(1.0)
                elif name.endswith("bias"):
                    param.zero_()
                else:
                    param.normal_(0.0, 0.02)
        return model.eval()

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {path}")
    params = dict(model.named_parameters(remove_duplicate=False))
    filled: set[str] = set()
    with torch.no_grad():
        for file in files:
            with safe_open(str(file), framework="pt", device="cpu") as f:
                for key in f.keys():
                    if key.endswith(_IGNORED):
                        continue
                    target = _destination(key, cfg)
                    if target is None:
                        raise ValueError(f"{file.name}: unexpected tensor {key!r}")
                    name, start, stop = target
                    if name == "lm_head.weight" and cfg.tie_word_embeddings:
                        continue
                    dest = params[name] if start is None else params[name][start:stop]
                    source = f.get_tensor(key)
                    if source.shape != dest.shape:
                        raise ValueError(f"{key}: checkpoint shape {tuple(source.shape)} "
                                         f"!= model shape {tuple(dest.shape)}")
                    dest.copy_(source)
                    filled.add(name if start is None else f"{name}[{start}:{stop}]")
    _check_complete(model, cfg, filled)
    model.eval()
    return model


def _destination(key: str, cfg: ModelConfig) -> tuple[str, int | None, int | None] | None:
    """Checkpoint key -> (parameter name, slice start, slice stop) in our module."""
    if key == "model.embed_tokens.weight":
        return "embed_tokens.weight", None, None
    if key == "model.norm.weight":
        return "norm.weight", None, None
    if key == "lm_head.weight":
        return "lm_head.weight", None, None
    match = _LAYER_KEY.match(key)
    if match is None:
        return None
    layer, rest = match.groups()
    prefix = f"layers.{layer}."
    q, kv, inter = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.intermediate_size
    fused = {
        "self_attn.q_proj": ("attn.qkv_proj", 0, q),
        "self_attn.k_proj": ("attn.qkv_proj", q, q + kv),
        "self_attn.v_proj": ("attn.qkv_proj", q + kv, q + 2 * kv),
        "mlp.gate_proj": ("mlp.gate_up_proj", 0, inter),
        "mlp.up_proj": ("mlp.gate_up_proj", inter, 2 * inter),
    }
    plain = {
        "self_attn.o_proj": "attn.o_proj", "self_attn.q_norm": "attn.q_norm",
        "self_attn.k_norm": "attn.k_norm", "mlp.down_proj": "mlp.down_proj",
        "input_layernorm": "input_layernorm", "post_attention_layernorm": "post_attention_layernorm",
    }
    module, _, leaf = rest.rpartition(".")
    if module in fused:
        name, start, stop = fused[module]
        return prefix + name + "." + leaf, start, stop
    if module in plain:
        return prefix + plain[module] + "." + leaf, None, None
    return None


def _check_complete(model: CausalLM, cfg: ModelConfig, filled: set[str]) -> None:
    """Every parameter (every slice of a fused one) must have come from the checkpoint."""
    q, kv, inter = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.intermediate_size
    expected: set[str] = set()
    for name, _ in model.named_parameters():
        if name.endswith("qkv_proj.weight") or name.endswith("qkv_proj.bias"):
            expected |= {f"{name}[0:{q}]", f"{name}[{q}:{q + kv}]", f"{name}[{q + kv}:{q + 2 * kv}]"}
        elif name.endswith("gate_up_proj.weight") or name.endswith("gate_up_proj.bias"):
            expected |= {f"{name}[0:{inter}]", f"{name}[{inter}:{2 * inter}]"}
        else:
            expected.add(name)
    missing = sorted(expected - filled)
    if missing:
        raise ValueError(f"checkpoint is missing {len(missing)} tensors, e.g. {missing[:3]}")
