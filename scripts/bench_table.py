"""Markdown tables of a `minedraft bench` run, as docs/benchmarks.md shows them.

    python scripts/bench_table.py docs/results/bench/bench.json           # print the tables
    python scripts/bench_table.py docs/results/bench/bench.json --write   # and rewrite the docs

--write rewrites the generated regions of README.md (the performance summary) and
docs/benchmarks.md (the tables) from the run, so the figures there cannot drift from it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from minedraft.bench.doc_regions import regenerate
from minedraft.bench.table import markdown_tables

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench_json", help="a bench.json written by `minedraft bench`")
    parser.add_argument("--write", action="store_true",
                        help="rewrite the marked regions of README.md and docs/benchmarks.md")
    args = parser.parse_args()
    report = json.loads(Path(args.bench_json).read_text())
    print(markdown_tables(report))
    if args.write:
        for path, text in regenerate(report, ROOT).items():
            changed = path.read_text() != text
            if changed:
                path.write_text(text)
            print(f"{path.relative_to(ROOT)}: {'rewritten' if changed else 'already up to date'}")


if __name__ == "__main__":
    main()
