"""The headline of a benchmark run, defined once for the terminal, the docs and bench.json:
the adaptive mode (auto) against the best fixed setting on the same cores, whatever mode and
k that is, and against transformers' generate on all cores. A fixed mode is never measured
against a chosen baseline alone (psd against sd): the reader is told what auto must beat.

Runs from before auto have no auto rows: their headline is psd against the best of the other
fixed settings. In them ar ran on one core; `runs_of` names those rows ar-1core.

With --rounds the ratios are paired: in each round the subject against that round's best
fixed setting (and generate), both measured in the round; stated as the median and range of
those ratios, never as a ratio of medians measured at different times. A round's best of a
dozen settings measured once is a lucky draw where runs are noisy, so the subject is also
held against the setting that was best in the other rounds (chosen there, compared here):
an unbiased baseline, as noisy as the rounds are few."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

TOKENS_PER_S = "output_tokens_per_s"
# One layout and one k for the whole run, every one on the same cores (ar's verifier on all
# of them, as psd's two services together) or on fewer of them: ar-1core, the verifier alone
# on one core, is labelled as such and still a setting a user could choose, so it counts
# among the fixed settings to beat (at C = 8 on the reference machine it ran faster than ar
# with two threads on both cores).
ONE_CORE_AR = "ar-1core"
FIXED_MODES = ("ar", ONE_CORE_AR, "sd", "sd-colocated", "psd")
GENERATE = "hf-generate"            # transformers' batched generate, all cores (peers.py)
SUBJECTS = ("auto", "psd")          # what the headline is about: auto, or psd in runs without it


def runs_of(report: dict) -> list[dict]:
    """A bench.json's rows as this harness names them: rows of ar that do not record the
    verifier's cores come from before ar was given every core, and ran on one."""
    return [{**r, "mode": ONE_CORE_AR} if r["mode"] == "ar" and "verifier_cpus" not in r else r
            for r in report["runs"]]


def _best(rows: list[dict], modes: tuple[str, ...]) -> dict | None:
    return max((r for r in rows if r["mode"] in modes), key=lambda r: r[TOKENS_PER_S], default=None)


def setting(row: dict) -> str:
    """"psd, k=4"; plain decoding and transformers have no k to name."""
    mode = row["mode"]
    return mode if mode in ("ar", ONE_CORE_AR) or mode.startswith("hf-") else f"{mode}, k={row['k']}"


def percent(ratio: float) -> str:
    """A throughput ratio as the gain a reader reads: 1.06 -> "+6%"."""
    return f"{(ratio - 1) * 100:+.0f}%"


def ratio_range(figures: dict, key: str) -> str:
    """The range of a headline ratio of `figures` (Headline.figures) over its rounds as gains,
    "-3% to +5%, 3 rounds"; "" for one round."""
    ratios = figures.get(f"{key}_rounds", [])
    return f"{percent(min(ratios))} to {percent(max(ratios))}, {len(ratios)} rounds" if len(ratios) > 1 else ""


def ratio_text(figures: dict, key: str) -> str:
    """A headline ratio as a gain: "+6%", or over rounds its median and range, "+2% (-3% to +5%, 3 rounds)"."""
    spread = ratio_range(figures, key)
    return percent(figures[key]) + (f" ({spread})" if spread else "")


def best_fixed_text(figures: dict) -> str:
    """"psd, k=4", or over rounds each round's best: "psd, k=4 or sd, k=2" where they differ."""
    return " or ".join(dict.fromkeys(figures.get("best_fixed_rounds") or [figures["best_fixed"]]))


def num_rounds(rows: list[dict]) -> int:
    """How many rounds the rows were measured in: 1 unless every row has the same number (> 1)
    of per-round throughputs to pair."""
    counts = {len(r.get("tokens_per_s_rounds", [])) for r in rows}
    return counts.pop() if len(counts) == 1 and min(counts) > 1 else 1


def round_rows(rows: list[dict], index: int) -> list[dict]:
    """The rows as round `index` measured them (throughput only; the rest stay medians)."""
    return [{**{key: value for key, value in r.items() if key != "tokens_per_s_rounds"},
             TOKENS_PER_S: r["tokens_per_s_rounds"][index]} for r in rows]


@dataclass(frozen=True)
class Headline:
    subject: dict                   # auto's row (psd's best k in runs without auto)
    best_fixed: dict | None         # the fastest fixed setting other than the subject
    generate: dict | None           # transformers' generate at the same concurrency
    rounds: tuple[Headline, ...] = ()    # each round's own headline, where there are rounds
    # Per round: (the subject over the fixed setting that was best on the other rounds, that
    # setting), both measured in the round. The best of a dozen settings measured once in a
    # round is a lucky draw on a noisy machine; a setting chosen elsewhere is not.
    held_out: tuple[tuple[float, str], ...] = ()

    def figures(self) -> dict:
        """What the subject's row stores: ratios of output throughput and the setting it is held
        against; over rounds, each ratio is the median of the paired per-round ratios, which
        (and each round's best fixed setting) are kept as KEY_rounds."""
        out: dict = {}
        if self.best_fixed is not None:
            out.update(best_fixed=setting(self.best_fixed),
                       over_best_fixed=self.subject[TOKENS_PER_S] / self.best_fixed[TOKENS_PER_S])
        if self.generate is not None:
            out["over_generate"] = self.subject[TOKENS_PER_S] / self.generate[TOKENS_PER_S]
        per_round = [top.figures() for top in self.rounds]
        for key in list(out) if per_round else []:
            values = [figures[key] for figures in per_round if key in figures]
            out[f"{key}_rounds"] = values
            if key != "best_fixed":
                out[key] = statistics.median(values)
        if self.held_out:
            out.update(over_held_out_best=statistics.median(ratio for ratio, _ in self.held_out),
                       over_held_out_best_rounds=[ratio for ratio, _ in self.held_out],
                       held_out_best_rounds=[name for _, name in self.held_out])
        return out

    def gains(self) -> list[tuple[str, str]]:
        """-> (baseline, "+6%") for the best fixed setting and transformers generate; over rounds
        the baseline is each round's best fixed setting and the gain says its range."""
        figures = self.figures()
        out = []
        if self.best_fixed is not None:
            of_each = " of each round" if self.rounds else ""
            out.append((f"the best fixed setting{of_each} ({best_fixed_text(figures)})",
                        ratio_text(figures, "over_best_fixed")))
        if "over_held_out_best" in figures:
            chosen = " or ".join(dict.fromkeys(figures["held_out_best_rounds"]))
            out.append((f"the best fixed setting of the other rounds ({chosen})",
                        ratio_text(figures, "over_held_out_best")))
        if self.generate is not None:
            out.append(("transformers generate", ratio_text(figures, "over_generate")))
        return out


def headline(rows: list[dict]) -> Headline | None:
    """The headline of the rows measured at one concurrency; None without auto or psd."""
    rounds = num_rounds(rows)
    for mode in SUBJECTS:
        subject = _best(rows, (mode,))
        if subject is not None:
            others = tuple(m for m in FIXED_MODES if m != mode)
            per_round = tuple(headline(round_rows(rows, index)) for index in range(rounds)) if rounds > 1 else ()
            return Headline(subject, _best(rows, others), _best(rows, (GENERATE,)), per_round,
                            _held_out(subject, [r for r in rows if r["mode"] in others], rounds))
    return None


def _held_out(subject: dict, fixed: list[dict], rounds: int) -> tuple[tuple[float, str], ...]:
    """Per round, the subject over the fixed setting with the best median throughput in the
    other rounds (both as measured in this round); () for one round or no fixed setting."""
    if rounds < 2 or not fixed:
        return ()
    out = []
    for index in range(rounds):
        others = [j for j in range(rounds) if j != index]
        chosen = max(fixed, key=lambda r: statistics.median(r["tokens_per_s_rounds"][j] for j in others))
        out.append((subject["tokens_per_s_rounds"][index] / chosen["tokens_per_s_rounds"][index], setting(chosen)))
    return tuple(out)
