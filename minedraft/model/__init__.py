"""The project's own PyTorch modules for decoder-only transformers (Qwen3, Qwen2, Llama)."""
