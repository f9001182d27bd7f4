"""Tokenizer for the gateway from a model directory's tokenizer.json (the `tokenizers`
library directly: the gateway imports neither torch nor transformers)."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer


class TextTokenizer:
    def __init__(self, model_dir: str) -> None:
        path = Path(model_dir) / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: the gateway needs the model's tokenizer.json")
        self._tokenizer = Tokenizer.from_file(str(path))

    @property
    def backend_tokenizer(self) -> Tokenizer:
        """The `tokenizers.Tokenizer` itself, for incremental detokenisation (minedraft/detokenizer.py)."""
        return self._tokenizer

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """add_special_tokens=False for text that already holds them (a rendered chat template)."""
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tokenizer.decode(list(token_ids), skip_special_tokens=skip_special_tokens)
