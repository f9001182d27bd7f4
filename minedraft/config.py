"""Model and engine configuration: frozen dataclasses, validated once, passed down whole."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from minedraft.constants import DTYPES

if TYPE_CHECKING:
    import torch

SUPPORTED_FAMILIES = ("qwen3", "qwen2", "llama")


@dataclass(frozen=True)
class RopeConfig:
    theta: float = 10000.0
    rope_type: str = "default"          # default | linear | llama3 | yarn
    factor: float = 1.0
    low_freq_factor: float = 1.0        # llama3
    high_freq_factor: float = 4.0       # llama3
    original_max_position: int = 8192   # llama3, yarn
    beta_fast: float = 32.0             # yarn
    beta_slow: float = 1.0              # yarn


@dataclass(frozen=True)
class ModelConfig:
    """The architecture facts the runner needs, read from a checkpoint's config.json."""

    family: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    max_position: int
    tie_word_embeddings: bool
    qkv_bias: bool
    qk_norm: bool
    mlp_bias: bool
    rope: RopeConfig
    eos_token_ids: tuple[int, ...]

    @staticmethod
    def from_dir(path: str | Path) -> "ModelConfig":
        raw = json.loads((Path(path) / "config.json").read_text())
        return ModelConfig.from_dict(raw)

    @staticmethod
    def from_dict(raw: dict) -> "ModelConfig":
        family = raw.get("model_type", "")
        if family not in SUPPORTED_FAMILIES:
            raise ValueError(f"model_type {family!r} is not supported; expected one of {SUPPORTED_FAMILIES}")
        heads = raw["num_attention_heads"]
        head_dim = raw.get("head_dim") or raw["hidden_size"] // heads
        eos = raw.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        if family == "qwen2":
            qkv_bias = True
        else:
            qkv_bias = bool(raw.get("attention_bias", False))
        return ModelConfig(
            family=family,
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            num_layers=raw["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=raw.get("num_key_value_heads") or heads,
            head_dim=head_dim,
            intermediate_size=raw["intermediate_size"],
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            max_position=raw.get("max_position_embeddings", 4096),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            qkv_bias=qkv_bias,
            qk_norm=family == "qwen3",
            mlp_bias=bool(raw.get("mlp_bias", False)),
            rope=_rope_config(raw),
            eos_token_ids=eos_ids,
        )


def _rope_config(raw: dict) -> RopeConfig:
    """Accepts both the newer `rope_parameters` and the older `rope_theta` + `rope_scaling` keys."""
    params = dict(raw.get("rope_parameters") or {})
    scaling = raw.get("rope_scaling") or {}
    params = {**scaling, **params}
    theta = params.get("rope_theta", raw.get("rope_theta", 10000.0))
    rope_type = params.get("rope_type", params.get("type", "default")) or "default"
    if rope_type not in ("default", "linear", "llama3", "yarn"):
        raise ValueError(f"rope_type {rope_type!r} is not supported")
    return RopeConfig(
        theta=float(theta),
        rope_type=rope_type,
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position=int(params.get("original_max_position_embeddings",
                                             raw.get("max_position_embeddings", 8192))),
        beta_fast=float(params.get("beta_fast", 32.0)),
        beta_slow=float(params.get("beta_slow", 1.0)),
    )


PACKED_WEIGHTS = ("auto", "on", "off")


@dataclass(frozen=True)
class RunnerConfig:
    """How one model instance runs: where, in which precision, with how much KV cache."""

    model_path: str
    dtype: str = "float32"
    device: str = "cpu"
    block_size: int = 16
    num_blocks: int = 1024
    num_threads: int = 0          # 0 = leave torch's default
    attention_backend: str = "sdpa"
    random_weights: bool = False  # benchmarks: read config.json only, draw weights at random
    packed_weights: str = "auto"  # oneDNN-packed linear weights (minedraft/model/packed_linear.py):
                                  # on, off, or auto (on CPU in float32 where they outgrow the cache)

    def __post_init__(self) -> None:
        if self.packed_weights not in PACKED_WEIGHTS:
            raise ValueError(f"packed_weights must be one of {list(PACKED_WEIGHTS)}, got {self.packed_weights!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {list(DTYPES)}, got {self.dtype!r}")
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if self.num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {self.num_blocks}")
        if self.num_threads < 0:
            raise ValueError(f"num_threads must be >= 0, got {self.num_threads}")
        if not (Path(self.model_path) / "config.json").is_file():
            raise ValueError(f"model_path {self.model_path!r} has no config.json")

    @property
    def torch_dtype(self) -> "torch.dtype":
        import torch

        return getattr(torch, self.dtype)
