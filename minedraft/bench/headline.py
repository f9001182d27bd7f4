"""The headline of a benchmark run, defined once for the terminal, the docs and bench.json:
the adaptive mode (auto) against the best fixed setting on the same cores, whatever mode and
k that is, and against transformers' generate on all cores. A fixed mode is never measured
against a chosen baseline alone (psd against sd): the reader is told what auto must beat.

Runs from before auto have no auto rows: their headline is psd against the best of the other
fixed settings. In them ar ran on one core; `runs_of` names those rows ar-1core."""

from __future__ import annotations

from dataclasses import dataclass

TOKENS_PER_S = "output_tokens_per_s"
# One layout and one k for the whole run, every one on the same cores (ar's verifier on all
# of them, as psd's two services together).
FIXED_MODES = ("ar", "sd", "sd-colocated", "psd")
ONE_CORE_AR = "ar-1core"            # ar's verifier on one core: labelled, never a headline baseline
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


def _gain(row: dict, baseline: dict) -> str:
    return percent(row[TOKENS_PER_S] / baseline[TOKENS_PER_S])


@dataclass(frozen=True)
class Headline:
    subject: dict                   # auto's row (psd's best k in runs without auto)
    best_fixed: dict | None         # the fastest fixed setting other than the subject
    generate: dict | None           # transformers' generate at the same concurrency

    def figures(self) -> dict:
        """What the subject's row stores: ratios of output throughput and the setting it is held against."""
        out: dict = {}
        if self.best_fixed is not None:
            out.update(best_fixed=setting(self.best_fixed),
                       over_best_fixed=self.subject[TOKENS_PER_S] / self.best_fixed[TOKENS_PER_S])
        if self.generate is not None:
            out["over_generate"] = self.subject[TOKENS_PER_S] / self.generate[TOKENS_PER_S]
        return out

    def gains(self) -> list[tuple[str, str]]:
        """-> (baseline, "+6%") for the best fixed setting and transformers generate."""
        out = []
        if self.best_fixed is not None:
            out.append((f"the best fixed setting ({setting(self.best_fixed)})", _gain(self.subject, self.best_fixed)))
        if self.generate is not None:
            out.append(("transformers generate", _gain(self.subject, self.generate)))
        return out


def headline(rows: list[dict]) -> Headline | None:
    """The headline of the rows measured at one concurrency; None without auto or psd."""
    for mode in SUBJECTS:
        subject = _best(rows, (mode,))
        if subject is not None:
            others = tuple(m for m in FIXED_MODES if m != mode)
            return Headline(subject, _best(rows, others), _best(rows, (GENERATE,)))
    return None
