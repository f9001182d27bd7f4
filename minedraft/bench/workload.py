"""Prompt sets: the bundled held-out prompts, a set shipped with the bench (DATASETS), or a
file in a common public format. JSONL rows may name their kind ("kind": "code"), so a run
can report acceptance per kind of prompt, and their own sampling ("temperature": 1.0,
"seed": 17; any of SAMPLING_KEYS), so one run can hold clients that ask for different
things; a row without them is sent with the bench's defaults (greedy)."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from minedraft import bundled

DATA = Path(__file__).resolve().parent / "data"
# mixed: two kinds of clients in one run, so acceptance differs per request and auto mode can
# give each its own draft length. Code completion: the bundled held-out code prompts, greedy.
# Creative writing: English prose, sampled at temperature 1.0 with a seed per row (its 0-based
# row index), so outputs stay reproducible and, verification being coupled, equal ar's. Greedy
# prose does not separate from code (the target falls into code-like text, the draft with it);
# sampled prose does, as a sampled draft is kept only where it is the target's own sample.
DATASETS = {"mixed": DATA / "mixed.jsonl"}
# A row's own sampling, sent as SamplingOptions keywords over the bench's; max_tokens and
# ignore_eos stay the bench's, so every request of a run has the same length.
SAMPLING_KEYS = {"temperature": (int, float), "top_p": (int, float), "top_k": (int,), "seed": (int,)}

Sampling = dict[str, float]     # SAMPLING_KEYS given by a row -> value


@dataclass(frozen=True)
class Workload:
    prompts: list[str]
    kinds: list[str]        # each prompt's kind, "" where its set names none
    sampling: list[Sampling | None] | None = None   # each prompt's own sampling; None: the bench's

    def __post_init__(self) -> None:
        if self.sampling is None:
            object.__setattr__(self, "sampling", [None] * len(self.prompts))
        if not len(self.prompts) == len(self.kinds) == len(self.sampling):
            raise ValueError(f"{len(self.prompts)} prompts but {len(self.kinds)} kinds and "
                             f"{len(self.sampling)} sampling entries")

    def head(self, count: int) -> Workload:
        """The first `count` prompts, each with its kind and sampling (an open loop's schedule)."""
        return Workload(self.prompts[:count], self.kinds[:count], self.sampling[:count])


def load_workload(path: str | None, limit: int) -> Workload:
    """Bundled prompts when path is None; a shipped set by name; else ShareGPT-style JSON
    (first human turn of each conversation), Spec-Bench-style question.jsonl (first turn) or
    plain JSONL/text lines. A short set is repeated to fill `limit`."""
    items = _items(path)
    if not items:
        raise ValueError(f"no prompts found in {path or 'the bundled set'}")
    while len(items) < limit:
        items = items + items
    items = items[:limit]
    return Workload([item[0] for item in items], [item[1] for item in items], [item[2] for item in items])


def _items(path: str | None) -> list[tuple[str, str, Sampling | None]]:
    """The set's (prompt, kind, sampling) triples, as load_workload names sets."""
    if path is None:
        return [(prompt, "", None) for prompt in bundled.load_prompts()]
    return _from_file(DATASETS.get(path, Path(path)))


@functools.cache
def longest_prompt_tokens(path: str | None, model_dir: str) -> int:
    """The longest prompt of the set (as load_workload names it) in the tokens of the model's
    tokenizer.json, or in UTF-8 bytes (never fewer than its tokens) where the directory has none.
    Kept per set and model: the bench asks once per run it starts."""
    prompts = [item[0] for item in _items(path)]
    vocabulary = Path(model_dir) / "tokenizer.json"
    if vocabulary.is_file():
        encode = Tokenizer.from_file(str(vocabulary)).encode
        return max((len(encode(prompt).ids) for prompt in prompts), default=0)
    return max((len(prompt.encode()) for prompt in prompts), default=0)


def load_prompts(path: str | None, limit: int) -> list[str]:
    """load_workload's prompts without their kinds."""
    return load_workload(path, limit).prompts


def _from_file(path: Path) -> list[tuple[str, str, Sampling | None]]:
    """-> (prompt, kind, sampling) triples."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        data = json.loads(text)
        return [(p, "", None) for p in (_sharegpt_first_turn(item) for item in data) if p]
    items = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            items.append((line, "", None))
            continue
        if isinstance(item, dict):
            items.append((_jsonl_prompt(item), item.get("kind", ""), _row_sampling(item, f"{path}:{number}")))
        else:
            items.append((_jsonl_prompt(item), "", None))
    return [(p, kind, sampling) for p, kind, sampling in items if p]


def _row_sampling(item: dict, where: str) -> Sampling | None:
    """The row's SAMPLING_KEYS, None when it gives none. Only the types are checked here (a
    string from a hand-edited file would fail far from its line); ranges are the server's."""
    sampling = {key: item[key] for key in SAMPLING_KEYS if key in item}
    for key, value in sampling.items():
        if isinstance(value, bool) or not isinstance(value, SAMPLING_KEYS[key]):
            kind = " or ".join(t.__name__ for t in SAMPLING_KEYS[key])
            raise ValueError(f"{where}: {key} must be {kind}, got {value!r}")
    return sampling or None


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
