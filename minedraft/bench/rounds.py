"""--rounds: a concurrency's runs made N times, interleaved (runs.round_order), folded into one
row per (mode, k). A run of a few seconds on these machines swings 10-25% from one run to the
next, so a figure worth stating is the median of its rounds, shown with their spread.

Every number in a row becomes the median of its rounds (ratios made within a round, such as
psd/sd, are so paired); a row keeps each round's throughput and the spread (max - min) /
median. The headline's ratios are paired by round in headline.py, from those throughputs."""

from __future__ import annotations

import math
import statistics
from typing import Any

from minedraft.bench.headline import TOKENS_PER_S


def median_value(values: list[Any]) -> Any:
    """The median of one figure over the rounds: numbers (nan left out, as a round with nothing
    to measure), dicts and lists figure by figure where their shapes agree; anything else,
    and values that are the same in every round (mode, k, cores), as round 1 has it."""
    first = values[0]
    if all(value == first for value in values):
        return first
    if all(isinstance(value, (int, float)) and not isinstance(value, bool) for value in values):
        finite = [value for value in values if not math.isnan(value)]
        return statistics.median(finite) if finite else float("nan")
    if all(isinstance(value, dict) and value.keys() == first.keys() for value in values):
        return {key: median_value([value[key] for value in values]) for key in first}
    if all(isinstance(value, list) and len(value) == len(first) for value in values):
        return [median_value(list(items)) for items in zip(*values)]
    return first            # e.g. a throughput series per second, whose length differs by round


def median_row(rows: list[dict]) -> dict:
    """One (mode, k)'s rows, one per round -> its row: the medians, every round's throughput
    and their spread; the output equalled ar's only if it did in every round."""
    row = {key: median_value([r[key] for r in rows]) if all(key in r for r in rows) else value
           for key, value in rows[0].items()}
    if "same_as_ar" in row:
        same = [r.get("same_as_ar") for r in rows]
        row["same_as_ar"] = False if False in same else None if None in same else True
    found = [{"round": i + 1, **d} for i, r in enumerate(rows) for d in r.get("differences", ())]
    if found:                                           # every round's, not round 1's alone
        row["differences"] = found
    if len(rows) > 1:
        throughputs = [r[TOKENS_PER_S] for r in rows]
        row.update(rounds=len(rows), tokens_per_s_rounds=throughputs,
                   tokens_per_s_spread=(max(throughputs) - min(throughputs)) / row[TOKENS_PER_S])
        if all("pace" in r for r in rows):              # the host's pace around each round's run
            row["pace_rounds"] = [r["pace"] for r in rows]
        for key in ("layout_share", "lent_share"):      # what auto did in each round, not a median
            if any(key in r for r in rows):
                row[f"{key}_rounds"] = [r.get(key) for r in rows]
    return row


def fold_rows(rounds: list[list[dict]]) -> list[dict]:
    """Rows of every round (transformers', which come as rows only) -> one per (mode, k), in round 1's order."""
    keys = [(r["mode"], r["k"]) for r in rounds[0]]
    return [median_row([r for rows in rounds for r in rows if (r["mode"], r["k"]) == key]) for key in keys]


def fold_runs(rounds: list[dict], listed: tuple[tuple[str, int], ...] | list[tuple[str, int]] = ()) -> dict:
    """Measured runs of every round ((mode, k) -> {"row", "steps", "token_ids", "history"}) ->
    one per (mode, k): the median row, and round 1's step records, outputs and auto's
    decisions. Round 1's, not the rounds pooled: the timeline and auto's choices are drawn on
    one run's clock, and the figures made from step records (shares, the cost model's error)
    are already medians. In `listed`'s order (the tables', not the order they ran in), then
    any not listed."""
    keys = sorted(rounds[0], key=lambda key: listed.index(key) if key in listed else len(listed))
    return {key: {**rounds[0][key], "row": median_row([runs[key]["row"] for runs in rounds if key in runs])}
            for key in keys}
