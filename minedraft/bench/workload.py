"""Prompt sets: the bundled held-out prompts, a set shipped with the bench (DATASETS), or a
file in a common public format. JSONL rows may name their kind ("kind": "code"), so a run
can report acceptance per kind of prompt."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from minedraft import bundled

DATA = Path(__file__).resolve().parent / "data"
# mixed: the bundled held-out code prompts alternating with English prose, outside the domain
# the bundled pair was trained on (Python source); acceptance is reported per kind, so how
# far the draft follows the target on each is measured, not assumed.
DATASETS = {"mixed": DATA / "mixed.jsonl"}


@dataclass(frozen=True)
class Workload:
    prompts: list[str]
    kinds: list[str]        # each prompt's kind, "" where its set names none


def load_workload(path: str | None, limit: int) -> Workload:
    """Bundled prompts when path is None; a shipped set by name; else ShareGPT-style JSON
    (first human turn of each conversation), Spec-Bench-style question.jsonl (first turn) or
    plain JSONL/text lines. A short set is repeated to fill `limit`."""
    if path is None:
        items = [(prompt, "") for prompt in bundled.load_prompts()]
    else:
        items = _from_file(DATASETS.get(path, Path(path)))
    if not items:
        raise ValueError(f"no prompts found in {path or 'the bundled set'}")
    while len(items) < limit:
        items = items + items
    return Workload([prompt for prompt, _ in items[:limit]], [kind for _, kind in items[:limit]])


def load_prompts(path: str | None, limit: int) -> list[str]:
    """load_workload's prompts without their kinds."""
    return load_workload(path, limit).prompts


def _from_file(path: Path) -> list[tuple[str, str]]:
    """-> (prompt, kind) pairs."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        data = json.loads(text)
        return [(p, "") for p in (_sharegpt_first_turn(item) for item in data) if p]
    items = []
    for line in filter(str.strip, text.splitlines()):
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            items.append((line, ""))
            continue
        items.append((_jsonl_prompt(item), item.get("kind", "") if isinstance(item, dict) else ""))
    return [(p, kind) for p, kind in items if p]


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
