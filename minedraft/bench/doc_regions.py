"""The parts of README.md and docs/benchmarks.md that quote a benchmark run, regenerated from
its bench.json so that no figure a reader sees is typed by hand. Each part sits between
`<!-- NAME:start -->` and `<!-- NAME:end -->`; the prose around it is left as it is.

    python scripts/bench_table.py docs/results/bench/bench.json --write
"""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

from minedraft.bench.table import best_by_mode, by_concurrency, markdown_tables, psd_gains

README = "README.md"
BENCHMARKS = "docs/benchmarks.md"
SUMMARY_REGION = "bench-summary"
TABLES_REGION = "bench-tables"
# Flags that change what a run measures, as `minedraft bench` spells them. Model paths are
# left out of the command shown: they name the machine the run was made on.
WORKLOAD_FLAGS = {
    "num_prompts": "--num-prompts", "max_tokens": "--max-tokens", "ignore_eos": "--natural-stop",
    "request_rate": "--request-rate", "dataset": "--dataset", "data_plane": "--data-plane",
    "all_cpus": "--all-cpus", "synthetic_acceptance": "--synthetic-acceptance",
    "random_weights": "--random-weights", "dtype": "--dtype", "target_device": "--target-device",
    "draft_device": "--draft-device", "num_blocks": "--num-blocks", "unequal": "--unequal",
    "peers": "--peers",
}


def replace_region(text: str, name: str, body: str) -> str:
    """`text` with what stands between NAME's markers replaced by `body`."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    if text.count(start) != 1 or text.count(end) != 1 or text.index(start) > text.index(end):
        raise ValueError(f"expected one {start} ... {end} region")
    head, rest = text.split(start)
    _, tail = rest.split(end)
    return f"{head}{start}\n{body}\n{end}{tail}"


def reproduce_command(config: dict) -> str:
    """The `minedraft bench` line that measures what `config` (a bench.json's) measured."""
    from minedraft.bench.main import add_parser

    defaults = vars(add_parser(argparse.ArgumentParser().add_subparsers()).parse_args([]))
    words = ["minedraft bench", "--modes", *config["modes"], "--k", *map(str, config["k"]),
             "--concurrency", *map(str, config["concurrency"])]
    for dest, flag in WORKLOAD_FLAGS.items():
        value = config.get(dest, defaults[dest])
        if value != defaults[dest]:
            words += [flag] if isinstance(value, bool) else [flag, str(value)]
    return " ".join([*words, "--out", config["out"]])


def _machine(report: dict) -> str:
    device = report["config"]["target_device"]
    cores = f"{report['environment']['cpus']}-core"
    return f"a {cores} CPU machine" if device == "cpu" else f"a {cores} machine with {device}"


def _series(parts: list[str], last: str = " and ") -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + last + parts[-1]


def readme_summary(report: dict) -> str:
    """A few sentences: psd's best-k gain over each baseline's best k at every concurrency run,
    and the commands that reproduce the run and these figures."""
    config = report["config"]
    runs = by_concurrency(report)
    clauses = []
    for concurrency, rows in runs.items():
        gains = psd_gains(best_by_mode(rows))
        if gains:   # the baselines are named once, at the first concurrency
            parts = [gain if clauses else f"{gain} over {label}" for label, gain in gains]
            clauses.append(f"{_series(parts)} at concurrency {concurrency}")
    if not clauses:
        return "The committed run has no psd run to compare."
    source = f"{config['out']}/bench.json"
    text = (f"From one run on {_machine(report)} (`{source}`, {config['max_tokens']} tokens a "
            f"request, every mode at the same concurrency), psd's output throughput at its best "
            f"k, against each mode at its best k, was {_series(clauses, ', and ')} (sd: the "
            f"drafter on its own device, as in psd, without the overlap).")
    if all(r.get("same_as_ar") is True for rows in runs.values() for r in rows):
        text += " Every run's output equalled ar's token for token."
    text += " To reproduce the run, then update these figures from it:"
    return "\n".join([textwrap.fill(text, 92, break_on_hyphens=False, break_long_words=False), "",
                      f"    {reproduce_command(config)}",
                      f"    python scripts/bench_table.py {source} --write"])


def regenerate(report: dict, root: Path) -> dict[Path, str]:
    """README.md and docs/benchmarks.md under `root` -> their text with the regions rewritten."""
    readme, benchmarks = root / README, root / BENCHMARKS
    return {readme: replace_region(readme.read_text(), SUMMARY_REGION, readme_summary(report)),
            benchmarks: replace_region(benchmarks.read_text(), TABLES_REGION, markdown_tables(report))}
