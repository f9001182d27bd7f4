"""What the tensor-parallel tests share: the bundled target, and a tiny llama checkpoint whose
shapes exercise every sharding rule.

Test modules load it with ``pytest_plugins = ["tp_helpers"]`` for its `tiny_checkpoint`
fixture; each module still writes its own.
They also import its names first, so pytest cannot rewrite its asserts: PYTEST_DONT_REWRITE.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from minedraft.config import ModelConfig

TARGET = Path(__file__).resolve().parents[1] / "minedraft" / "bundled" / "target"
# llama with q/k/v, o_proj and MLP biases (row-parallel biases), one KV head (replicated
# over two ranks), an odd vocabulary (padded LM head) and an untied head.
TINY = dict(model_type="llama", vocab_size=1001, hidden_size=64, intermediate_size=96,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
            max_position_embeddings=128, rms_norm_eps=1e-6, attention_bias=True, mlp_bias=True,
            tie_word_embeddings=False, rope_theta=10000.0)


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


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory) -> Path:
    return _save_tiny_checkpoint(tmp_path_factory.mktemp("tp") / "tiny-llama")
