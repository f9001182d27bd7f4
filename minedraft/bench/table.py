"""The columns of a benchmark table, each figure's formatting defined once, and the two views
of them: the terminal table `minedraft bench` prints and the markdown tables of
docs/benchmarks.md (scripts/bench_table.py). A column no row has a figure for is left out of
both, so a run without auto or a cost model shows no empty auto columns, and a run of one
round no spread.

Both views are laid out by minedraft/tables.py, as every table the project prints."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from minedraft.bench.headline import FIXED_MODES, GENERATE, ONE_CORE_AR, TOKENS_PER_S, headline, num_rounds, runs_of
from minedraft.tables import markdown_lines, text_table


@dataclass(frozen=True)
class Column:
    header: str
    width: int                      # in the terminal; markdown cells are not padded
    cell: Callable[[dict], str]     # the figure as text, "" where the row has none


def _figure(key: str, spec: str, scale: float = 1.0) -> Callable[[dict], str]:
    return lambda row: format(row[key] * scale, spec) if key in row else ""


def _same_as_ar(row: dict) -> str:
    same = row.get("same_as_ar")
    return "n/a" if same is None else "yes" if same else "NO"


def _layout(row: dict) -> str:
    """auto's most used layout and its share of the steps, e.g. "psd 62%"."""
    share = row.get("layout_share")
    if not share:
        return ""
    layout = max(share, key=share.get)
    return f"{layout} {share[layout] * 100:.0f}%"


def _model_error(row: dict) -> str:
    """The cost model's median relative error, draft calls / verify calls ("-": no prediction)."""
    if not row.get("model_predictions"):
        return ""
    parts = (row.get(f"model_error_{kind}", float("nan")) for kind in ("draft", "verify"))
    return "/".join("-" if math.isnan(e) else f"{e * 100:.0f}%" for e in parts)


MODE = Column("mode", 13, lambda row: row["mode"])
# transformers' rows (hf-*) choose their own draft length: no k to show. auto's is k_max.
K = Column("k", 3, lambda row: "" if row["mode"].startswith("hf-") else str(row["k"]))
THROUGHPUT = Column("tok/s", 8, _figure(TOKENS_PER_S, ".1f"))
# Over --rounds: tok/s is the median of the rounds, spread % its (max - min) / median.
SPREAD = Column("spread %", 9, _figure("tokens_per_s_spread", ".1f", 100))
# The host's pace around the run against the other runs' at its concurrency (bench/pace.py):
# 0.80, the run was made while the machine ran 20% slow.
PACE = Column("pace", 6, _figure("relative_pace", ".2f"))
REQUESTS = Column("req/s", 7, _figure("requests_per_s", ".2f"))
SAME_AS_AR = Column("==ar", 6, _same_as_ar)
COLUMNS = (MODE, K, THROUGHPUT, SPREAD, PACE, REQUESTS,
           Column("p50 s", 7, _figure("latency_p50_s", ".2f")),
           Column("p99 s", 7, _figure("latency_p99_s", ".2f")),
           Column("TTFT s", 7, _figure("ttft_p50_s", ".2f")),
           Column("TPOT ms", 8, _figure("tpot_mean_s", ".1f", 1e3)),
           Column("MAL", 6, _figure("mean_acceptance_length", ".2f")),
           Column("gw %", 6, _figure("gateway_share", ".1f", 100)),
           Column("dp %", 6, _figure("data_plane_share", ".1f", 100)),
           Column("ceil", 6, _figure("ceiling", ".2f")),
           Column("psd/sd", 7, _figure("psd_over_sd", ".2f")),
           Column("eff", 6, _figure("overlap_efficiency", ".2f")),
           Column("layout", 9, _layout),
           Column("mean k", 7, _figure("mean_draft_length", ".2f")),
           Column("model err", 10, _model_error),
           Column("/best", 6, _figure("over_best_fixed", ".2f")),
           Column("/gen", 6, _figure("over_generate", ".2f")),
           SAME_AS_AR)
# The docs state once, above the tables, that every output equals ar's.
MARKDOWN_COLUMNS = tuple(c for c in COLUMNS if c not in (REQUESTS, SAME_AS_AR))
# The fixed modes that run at a draft length: the overview names each at its best k.
DRAFTING_MODES = ("sd", "sd-colocated", "psd")
# The rows of a run that go in its tables, in this order within a concurrency.
TABLE_MODES = ("auto", "ar", ONE_CORE_AR, "sd", "sd-colocated", "psd", GENERATE)


def _present(columns: Iterable[Column], rows: list[dict]) -> tuple[Column, ...]:
    return tuple(c for c in columns if c in (MODE, K, THROUGHPUT) or any(c.cell(row) for row in rows))


def _terminal_lines(rows: list[list[str]], columns: Sequence[Column]) -> list[str]:
    """The columns' own widths, which include the space before a figure; the mode flush left."""
    return text_table(rows, [c.width for c in columns], left=1, separator="")


def _note(row: dict) -> str | None:
    """Rows that are not an equal-concurrency run of our services: throughput and a label only."""
    if row["mode"].startswith("hf-"):
        return f"(transformers, batch {row['peer_batch']}, all cores, same prompts and length)"
    if row["mode"] == "psd-2xC":
        return f"({row['label']})"
    return None


def headline_text(rows: list[dict]) -> str:
    """"auto: +3% over the best fixed setting (psd, k=4), -5% over transformers generate"."""
    top = headline(rows)
    gains = top.gains() if top else []
    return f"{top.subject['mode']}: " + ", ".join(f"{g} against {label}" for label, g in gains) if gains else ""


def _details(rows: list[dict]) -> list[str]:
    """Figures a row has too many of for a column: acceptance per kind of prompt, and the
    throughput and latency of each phase of a --rate-steps run."""
    lines = []
    for row in rows:
        who = f"{row['mode']} k={row['k']}"
        if row.get("acceptance_by_kind"):
            kinds = ", ".join(f"{kind} {a['mean_acceptance_length']:.2f} ({a['acceptance_rate'] * 100:.0f}%)"
                              for kind, a in row["acceptance_by_kind"].items())
            lines.append(f"  {who}: MAL (acceptance rate) by kind: {kinds}")
        if row.get("phases"):
            phases = " | ".join(f"{p['rate']:g}/s: {p[TOKENS_PER_S]:.1f} tok/s, p50 {p['latency_p50_s']:.2f} s"
                                for p in row["phases"])
            lines.append(f"  {who}: per phase: {phases}")
    return lines


def rounds_note(rows: list[dict]) -> str:
    """What the figures are over rounds ("" for one round): said once above a table."""
    rounds = num_rounds(rows)
    return f"medians of {rounds} interleaved rounds; spread %: (max - min) / median of tok/s" if rounds > 1 else ""


def terminal_table(rows: list[dict], concurrency: int) -> str:
    """The rows measured at one concurrency, as `minedraft bench` prints them."""
    half = concurrency // 2
    psd = f"2 x {half}" if half else "one batch of 1"
    columns = _present(COLUMNS, [r for r in rows if _note(r) is None])
    over_rounds = rounds_note(rows)
    lines = [f"\n== concurrency {concurrency}: ar/sd hold {concurrency} requests as one batch, psd as {psd}, "
             f"auto {concurrency} in the layout it picks" + (f"; {over_rounds}" if over_rounds else "") + " ==",
             *_terminal_lines([[c.header for c in columns]], columns)]
    short = (MODE, K, THROUGHPUT, SPREAD) if SPREAD in columns else (MODE, K, THROUGHPUT)
    for row in rows:
        note = _note(row)
        if note is None:
            lines += _terminal_lines([[c.cell(row) for c in columns]], columns)
        else:
            lines.append(_terminal_lines([[c.cell(row) for c in short]], short)[0] + "   " + note)
    lines += _details(rows)
    text = headline_text(rows)
    return "\n".join(lines + ([f"headline: {text}"] if text else []))


def markdown_table(rows: list[dict], top: dict | None = None) -> list[str]:
    """One markdown table; `top`'s throughput is set in bold."""
    columns = _present(MARKDOWN_COLUMNS, rows)
    cells = [[c.cell(row) for c in columns] for row in rows]
    for row, row_cells in zip(rows, cells):
        if row is top:
            index = columns.index(THROUGHPUT)
            row_cells[index] = f"**{row_cells[index]}**"
    return markdown_lines([c.header for c in columns], cells)


def by_concurrency(report: dict) -> dict[int, list[dict]]:
    """The side-by-side runs of a bench.json (our modes and transformers' generate), per
    concurrency, auto first."""
    runs = [r for r in runs_of(report) if r["mode"] in TABLE_MODES]
    runs.sort(key=lambda r: TABLE_MODES.index(r["mode"]))      # stable: each mode's k stay in order
    return {c: [r for r in runs if r["concurrency"] == c] for c in sorted({r["concurrency"] for r in runs})}


def best_by_mode(rows: list[dict]) -> dict[str, dict]:
    """Each mode's row at its fastest k, in the order the modes were run."""
    modes = dict.fromkeys(r["mode"] for r in rows)
    return {m: max((r for r in rows if r["mode"] == m), key=lambda r: r[TOKENS_PER_S]) for m in modes}


def _best_k(mode: str, row: dict) -> str:
    return mode if mode.startswith("hf-") else f"{mode} (k={row['k']})"


def markdown_tables(report: dict) -> str:
    """A table per concurrency, each followed by the best k of every mode and the headline."""
    out: list[str] = []
    for concurrency, rows in by_concurrency(report).items():
        best = best_by_mode(rows)
        over_rounds = rounds_note(rows)
        out += [f"### Concurrency {concurrency}", "", *([f"Figures: {over_rounds}.", ""] if over_rounds else []),
                *markdown_table(rows, top=max(rows, key=lambda r: r[TOKENS_PER_S])), ""]
        summary = ", ".join(f"{_best_k(m, b)} {b[TOKENS_PER_S]:.1f}" for m, b in best.items())
        text = headline_text(rows)
        out.append(f"Best k of each mode: {summary} tok/s." + (f" **{text}.**" if text else ""))
        out.append("")
    return "\n".join(out).rstrip("\n")


def _ratio_cell(figures: dict, key: str) -> str:
    """"0.94 (0.88-1.01)": the median ratio and its range over the rounds."""
    if key not in figures:
        return ""
    ratios = figures.get(f"{key}_rounds", [])
    spread = f" ({min(ratios):.2f}-{max(ratios):.2f})" if len(ratios) > 1 else ""
    return f"{figures[key]:.2f}{spread}"


def overview_table(report: dict) -> str:
    """The whole sweep in one table, a row per concurrency: auto's throughput and most used
    layout, each fixed mode at its best k, transformers' generate, auto over the best fixed
    setting (of each round, and of the other rounds), auto's p50 latency over that of the
    fastest fixed setting, and auto's mean draft length. "" for a run without auto."""
    runs = by_concurrency(report)
    modes = [m for m in (*FIXED_MODES, GENERATE) if any(r["mode"] == m for rows in runs.values() for r in rows)]
    lines = []
    for concurrency, rows in runs.items():
        top = headline(rows)
        if top is None or top.subject["mode"] != "auto":
            continue
        auto, best = top.subject, best_by_mode(rows)
        figures = top.figures()
        cells = [str(concurrency), f"{auto[TOKENS_PER_S]:.0f}", _layout(auto)]
        for mode in modes:
            row = best.get(mode)
            k = f" (k={row['k']})" if row and mode in DRAFTING_MODES else ""
            cells.append(f"{row[TOKENS_PER_S]:.0f}{k}" if row else "")
        fixed = top.best_fixed
        p50 = (f"{auto['latency_p50_s'] / fixed['latency_p50_s']:.2f}"
               if fixed and fixed.get("latency_p50_s") and "latency_p50_s" in auto else "")
        cells += [_ratio_cell(figures, "over_best_fixed"), _ratio_cell(figures, "over_held_out_best"), p50,
                  _figure("mean_draft_length", ".1f")(auto)]
        lines.append(cells)
    if not lines:
        return ""
    names = {GENERATE: "transformers generate", **{m: f"{m} best" for m in DRAFTING_MODES}}
    header = ["C", "auto tok/s", "auto's layout", *[names.get(m, m) for m in modes],
              "auto / best fixed", "auto / other rounds' best", "p50 / best fixed's", "auto mean k"]
    rounds = num_rounds(next(iter(runs.values())))
    note = (f"tok/s: medians of {rounds} interleaved rounds; a ratio is the median of the rounds' own, "
            "its range in brackets" if rounds > 1 else "tok/s of one round")
    return "\n".join([textwrap.fill(f"{note}; auto's layout: its most used, by share of steps.", 92), "",
                      *markdown_lines(header, lines)])
