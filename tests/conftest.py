"""Shared fixtures: tiny random Hugging Face checkpoints of each supported family."""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import pytest
import torch

torch.set_num_threads(int(os.environ.get("MINEDRAFT_TEST_THREADS", "1")))

TINY_SHAPE = dict(vocab_size=211, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)


def _save_tiny(family: str, out: Path, **overrides) -> Path:
    import transformers

    cls_config, cls_model = {
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
    }[family]
    torch.manual_seed(zlib.crc32(family.encode()))   # not hash(): str hashes change per process
    config = cls_config(**{**TINY_SHAPE, **overrides})
    model = cls_model(config)
    with torch.no_grad():  # random init is small; make norms and biases non-trivial too
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    return {
        "qwen3": _save_tiny("qwen3", root / "qwen3", head_dim=32, tie_word_embeddings=True),
        "qwen2": _save_tiny("qwen2", root / "qwen2", tie_word_embeddings=False),
        "llama": _save_tiny("llama", root / "llama", tie_word_embeddings=False, attention_bias=True,
                            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                          "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
    }
