"""The model pair and held-out prompts that ship with the project (see MODEL_CARD.md)."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent
TARGET = str(ROOT / "target")
DRAFT = str(ROOT / "draft")


def load_prompts(limit: int | None = None) -> list[str]:
    """Held-out code snippets (files the bundled models were not trained on)."""
    lines = (ROOT / "prompts.jsonl").read_text().splitlines()
    prompts = [json.loads(line)["prompt"] for line in lines if line.strip()]
    return prompts[:limit] if limit is not None else prompts
