"""Prompt sets: the bundled held-out prompts, or a file in a common public format."""

from __future__ import annotations

import json
from pathlib import Path

from minedraft import bundled


def load_prompts(path: str | None, limit: int) -> list[str]:
    """Bundled prompts when path is None; else ShareGPT-style JSON (first human turn of each
    conversation), Spec-Bench-style question.jsonl (first turn) or plain JSONL/text lines."""
    if path is None:
        prompts = bundled.load_prompts()
    else:
        prompts = _from_file(Path(path))
    if not prompts:
        raise ValueError(f"no prompts found in {path or 'the bundled set'}")
    while len(prompts) < limit:                 # repeat a short set to fill the run
        prompts = prompts + prompts
    return prompts[:limit]


def _from_file(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        data = json.loads(text)
        return [p for p in (_sharegpt_first_turn(item) for item in data) if p]
    prompts = []
    for line in filter(str.strip, text.splitlines()):
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            prompts.append(line)
            continue
        prompts.append(_jsonl_prompt(item))
    return [p for p in prompts if p]


def _sharegpt_first_turn(item: dict) -> str:
    for turn in item.get("conversations", item.get("conversation", [])):
        if turn.get("from", turn.get("role")) in ("human", "user"):
            return turn.get("value", turn.get("content", ""))
    return ""


def _jsonl_prompt(item) -> str:
    if isinstance(item, str):
        return item
    if "turns" in item:                          # Spec-Bench question.jsonl
        return item["turns"][0] if item["turns"] else ""
    for key in ("prompt", "text", "question", "instruction"):
        if key in item:
            return item[key]
    return ""
