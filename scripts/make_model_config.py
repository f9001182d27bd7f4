"""Write a model directory with only config.json (real published shapes) and the bundled
tokenizer, for timing runs with `--random-weights` where checkpoints cannot be downloaded.

    python scripts/make_model_config.py qwen3-32b /tmp/models/qwen3-32b
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from minedraft import bundled

QWEN3 = dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], vocab_size=151936,
             max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6,
             hidden_act="silu", attention_bias=False, eos_token_id=151645, bos_token_id=151643)
SHAPES = {
    "qwen3-32b": dict(QWEN3, hidden_size=5120, num_hidden_layers=64, num_attention_heads=64,
                      num_key_value_heads=8, head_dim=128, intermediate_size=25600, tie_word_embeddings=False),
    "qwen3-1.7b": dict(QWEN3, hidden_size=2048, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, intermediate_size=6144, tie_word_embeddings=True),
    "qwen3-0.6b": dict(QWEN3, hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, intermediate_size=3072, tie_word_embeddings=True),
    # CPU dry runs of the GPU script: the same path at a size this machine can run.
    "tiny-target": dict(QWEN3, vocab_size=4096, max_position_embeddings=2048, hidden_size=256,
                        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                        intermediate_size=768, tie_word_embeddings=True),
    "tiny-draft": dict(QWEN3, vocab_size=4096, max_position_embeddings=2048, hidden_size=128,
                       num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                       intermediate_size=384, tie_word_embeddings=True),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shape", choices=sorted(SHAPES))
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "config.json").write_text(json.dumps(SHAPES[args.shape], indent=2) + "\n")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(bundled.TARGET) / name, args.out / name)
    print(f"wrote {args.out} ({args.shape}, random weights only)")


if __name__ == "__main__":
    main()
