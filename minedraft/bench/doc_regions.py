"""The parts of README.md and docs/benchmarks.md that quote a benchmark run, regenerated from
its bench.json so that no figure a reader sees is typed by hand. Each part sits between
`<!-- NAME:start -->` and `<!-- NAME:end -->`; the prose around it is left as it is.

    python scripts/bench_table.py docs/results/bench/bench.json --write

A run of several --rounds is quoted as medians with the range over its rounds; a bench.json
from before rounds (no "rounds" in its config) is one round.
"""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

from minedraft.bench.headline import FIXED_MODES, ONE_CORE_AR, best_fixed_text, headline, percent, ratio_range
from minedraft.bench.table import by_concurrency, markdown_tables, overview_table

README = "README.md"
BENCHMARKS = "docs/benchmarks.md"
SUMMARY_REGION = "bench-summary"
TABLES_REGION = "bench-tables"
OVERVIEW_REGION = "bench-overview"      # docs/benchmarks.md: the sweep in one table (auto's runs only)
# Flags that change what a run measures, as `minedraft bench` spells them. Model paths are
# left out of the command shown: they name the machine the run was made on.
WORKLOAD_FLAGS = {
    "num_prompts": "--num-prompts", "max_tokens": "--max-tokens", "ignore_eos": "--natural-stop",
    "request_rate": "--request-rate", "dataset": "--dataset", "data_plane": "--data-plane",
    "all_cpus": "--all-cpus", "synthetic_acceptance": "--synthetic-acceptance",
    "random_weights": "--random-weights", "dtype": "--dtype", "target_device": "--target-device",
    "draft_device": "--draft-device", "num_blocks": "--num-blocks", "unequal": "--unequal",
    "peers": "--peers", "psd_k": "--psd-k", "auto_k": "--auto-k", "rate_steps": "--rate-steps",
    "memory_bound": "--memory-bound", "rounds": "--rounds",
}


def replace_region(text: str, name: str, body: str) -> str:
    """`text` with what stands between NAME's markers replaced by `body`."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    if text.count(start) != 1 or text.count(end) != 1 or text.index(start) > text.index(end):
        raise ValueError(f"expected one {start} ... {end} region")
    head, rest = text.split(start)
    _, tail = rest.split(end)
    return f"{head}{start}\n{body}\n{end}{tail}"


def reproduce_command(config: dict, modes: list[str] | None = None) -> str:
    """The `minedraft bench` line that measures what `config` (a bench.json's) measured;
    `modes` as this harness names them, where they differ from the config's."""
    from minedraft.bench.main import add_parser

    defaults = vars(add_parser(argparse.ArgumentParser().add_subparsers()).parse_args([]))
    words = ["minedraft bench", "--modes", *(modes or config["modes"]), "--k", *map(str, config["k"]),
             "--concurrency", *map(str, config["concurrency"])]
    for dest, flag in WORKLOAD_FLAGS.items():
        value = config.get(dest, defaults[dest])
        if value == defaults[dest]:
            continue
        if isinstance(value, bool):
            words.append(flag)
        else:
            words += [flag, *map(str, value if isinstance(value, list) else [value])]
    return " ".join([*words, "--out", config["out"]])


def _machine(report: dict) -> str:
    device = report["config"]["target_device"]
    cores = f"{report['environment']['cpus']}-core"
    model = report["environment"].get("processor")          # absent in runs recorded before it was
    machine = f"a {cores} CPU machine" if device == "cpu" else f"a {cores} machine with {device}"
    return f"{machine} ({model})" if model else machine


def _series(parts: list[str], last: str = " and ") -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + last + parts[-1]


def _gain(figures: dict, key: str, against: str = "") -> str:
    """"+6% (sd, k=2)"; over rounds "+2% (sd, k=2; -3% to +5%, 3 rounds)"."""
    notes = [part for part in (against, ratio_range(figures, key)) if part]
    return percent(figures[key]) + (f" ({'; '.join(notes)})" if notes else "")


def readme_summary(report: dict) -> str:
    """A few sentences: the headline at every concurrency run (auto, or psd in runs without
    it, against the best fixed setting and transformers' generate; over rounds, the median
    and range of ratios paired within a round), and the commands that reproduce the run and
    these figures."""
    config = report["config"]
    rounds = config.get("rounds", 1)
    runs = by_concurrency(report)
    fixed, generate, subject, modes = [], [], "", set()
    for concurrency, rows in runs.items():
        top = headline(rows)
        if top is None:
            continue
        subject = top.subject["mode"]
        figures = top.figures()
        modes |= {r["mode"] for r in rows}
        if "over_best_fixed" in figures:
            fixed.append(f"{_gain(figures, 'over_best_fixed', best_fixed_text(figures))} at concurrency {concurrency}")
        if "over_generate" in figures:
            generate.append(f"{_gain(figures, 'over_generate')} at concurrency {concurrency}")
    if not fixed and not generate:
        return "The committed run has no auto or psd run to compare."
    source = f"{config['out']}/bench.json"
    baselines = [m for m in FIXED_MODES if m in modes and m != subject]
    over_rounds = f"; {rounds} interleaved rounds, each gain the median of the rounds' own" if rounds > 1 else ""
    text = (f"From one run on {_machine(report)} (`{source}`, {config['max_tokens']} tokens a request, every "
            f"mode at the same concurrency{over_rounds}), {subject}'s output throughput"
            + (" at its best k" if subject == "psd" else ""))
    if fixed:
        text += (f", against the best fixed setting on the same cores (the fastest of {_series(baselines, ' or ')} "
                 f"at any k{', in each round' if rounds > 1 else ''}), was {_series(fixed, ', and ')}")
    if generate:
        text += f"{';' if fixed else ','} against transformers' generate on all cores, {_series(generate, ', and ')}"
    text += "."
    one_core = ONE_CORE_AR in modes and "ar" not in modes
    if one_core:
        text += " In this run ar's verifier had one core (ar-1core): ar on every core is not among the fixed settings."
    if all(r.get("same_as_ar") is True for rows in runs.values() for r in rows):
        text += " Every run's output equalled ar's token for token."
    text += " To reproduce the run, then update these figures from it:"
    return "\n".join([textwrap.fill(text, 92, break_on_hyphens=False, break_long_words=False), "",
                      f"    {reproduce_command(config, _one_core_modes(config) if one_core else None)}",
                      f"    python scripts/bench_table.py {source} --write"])


def _one_core_modes(config: dict) -> list[str]:
    """A run from before ar had every core asked for ar: today that is ar-1core."""
    return [ONE_CORE_AR if mode == "ar" else mode for mode in config["modes"]]


def regenerate(report: dict, root: Path) -> dict[Path, str]:
    """README.md and docs/benchmarks.md under `root` -> their text with the regions rewritten."""
    readme, benchmarks = root / README, root / BENCHMARKS
    text = replace_region(benchmarks.read_text(), TABLES_REGION, markdown_tables(report))
    return {readme: replace_region(readme.read_text(), SUMMARY_REGION, readme_summary(report)),
            benchmarks: replace_region(text, OVERVIEW_REGION, overview_table(report))}
