"""Write the held-out prompt set (minedraft/bundled/prompts.jsonl) from the held-out files
of the training split: code the bundled models never saw, cut at line starts."""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(num_prompts: int = 64, chars: int = 320, seed: int = 0) -> None:
    spec = importlib.util.spec_from_file_location("train", ROOT / "scripts" / "train_bundled_pair.py")
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    _, held_out = train.stdlib_files()
    rng = random.Random(seed)
    prompts = []
    while len(prompts) < num_prompts:
        path = rng.choice(held_out)
        text = train.read(path)
        if len(text) < 4 * chars:
            continue
        start = text.rfind("\n", 0, rng.randrange(0, len(text) - 2 * chars)) + 1
        end = text.rfind("\n", start, start + chars) + 1
        prompt = text[start:end]
        if len(prompt.strip()) < chars // 2:
            continue
        prompts.append({"prompt": prompt, "source": path.name})
    out = ROOT / "minedraft" / "bundled" / "prompts.jsonl"
    out.write_text("".join(json.dumps(p) + "\n" for p in prompts))
    print(f"wrote {len(prompts)} prompts to {out}")


if __name__ == "__main__":
    main()
