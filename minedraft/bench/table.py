"""The columns of a benchmark table, each figure's formatting defined once, and the two views
of them: the terminal table `minedraft bench` prints and the markdown tables of
docs/benchmarks.md (scripts/bench_table.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from minedraft.constants import BENCH_MODES

TOKENS_PER_S = "output_tokens_per_s"


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


MODE = Column("mode", 13, lambda row: row["mode"])
# transformers' rows (hf-*) choose their own draft length: no k to show.
K = Column("k", 3, lambda row: "" if row["mode"].startswith("hf-") else str(row["k"]))
THROUGHPUT = Column("tok/s", 8, _figure(TOKENS_PER_S, ".1f"))
REQUESTS = Column("req/s", 7, _figure("requests_per_s", ".2f"))
SAME_AS_AR = Column("==ar", 6, _same_as_ar)
COLUMNS = (MODE, K, THROUGHPUT, REQUESTS,
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
           SAME_AS_AR)
# The docs state once, above the tables, that every output equals ar's.
MARKDOWN_COLUMNS = tuple(c for c in COLUMNS if c not in (REQUESTS, SAME_AS_AR))
# What psd's best k is compared with, and how a reader is told so.
GAIN_BASELINES = (("sd", "the best sd"), ("sd-colocated", "co-located sd"), ("ar", "ar"))


def _terminal_line(cells: Iterable[str], columns: Iterable[Column]) -> str:
    return "".join(cell.ljust(c.width) if c is MODE else cell.rjust(c.width)
                   for cell, c in zip(cells, columns))


def _note(row: dict) -> str | None:
    """Rows that are not an equal-concurrency run of our services: throughput and a label only."""
    if row["mode"].startswith("hf-"):
        return f"(transformers, batch {row['peer_batch']}, all cores, same prompts and length)"
    if row["mode"] == "psd-2xC":
        return f"({row['label']})"
    return None


def terminal_table(rows: list[dict], concurrency: int) -> str:
    """The rows measured at one concurrency, as `minedraft bench` prints them."""
    half = concurrency // 2
    psd = f"2 x {half}" if half else "one batch of 1"
    lines = [f"\n== concurrency {concurrency}: ar/sd hold {concurrency} requests as one batch, "
             f"psd as {psd} ==", _terminal_line((c.header for c in COLUMNS), COLUMNS)]
    short = (MODE, K, THROUGHPUT)
    for row in rows:
        note = _note(row)
        if note is None:
            lines.append(_terminal_line((c.cell(row) for c in COLUMNS), COLUMNS))
        else:
            lines.append(_terminal_line((c.cell(row) for c in short), short) + "   " + note)
    return "\n".join(lines)


def markdown_table(rows: list[dict], top: dict | None = None) -> list[str]:
    """One markdown table; `top`'s throughput is set in bold."""
    lines = ["| " + " | ".join(c.header for c in MARKDOWN_COLUMNS) + " |",
             "|" + "---|" * len(MARKDOWN_COLUMNS)]
    for row in rows:
        cells = [c.cell(row) for c in MARKDOWN_COLUMNS]
        if row is top:
            index = MARKDOWN_COLUMNS.index(THROUGHPUT)
            cells[index] = f"**{cells[index]}**"
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def by_concurrency(report: dict) -> dict[int, list[dict]]:
    """The side-by-side runs (ar, sd, sd-colocated, psd) of a bench.json, per concurrency."""
    runs = [r for r in report["runs"] if r["mode"] in BENCH_MODES]
    return {c: [r for r in runs if r["concurrency"] == c] for c in sorted({r["concurrency"] for r in runs})}


def best_by_mode(rows: list[dict]) -> dict[str, dict]:
    """Each mode's row at its fastest k, in the order the modes were run."""
    modes = dict.fromkeys(r["mode"] for r in rows)
    return {m: max((r for r in rows if r["mode"] == m), key=lambda r: r[TOKENS_PER_S]) for m in modes}


def psd_gains(best: dict[str, dict]) -> list[tuple[str, str]]:
    """psd's best k against each baseline's best k -> (baseline label, "+6%")."""
    if "psd" not in best:
        return []
    psd = best["psd"][TOKENS_PER_S]
    return [(label, f"{(psd / best[mode][TOKENS_PER_S] - 1) * 100:+.0f}%")
            for mode, label in GAIN_BASELINES if mode in best]


def markdown_tables(report: dict) -> str:
    """A table per concurrency, each followed by the best k of every mode and psd's gains."""
    out: list[str] = []
    for concurrency, rows in by_concurrency(report).items():
        best = best_by_mode(rows)
        out += [f"### Concurrency {concurrency}", "",
                *markdown_table(rows, top=max(rows, key=lambda r: r[TOKENS_PER_S])), ""]
        summary = ", ".join(f"{m} (k={b['k']}) {b[TOKENS_PER_S]:.1f}" for m, b in best.items())
        gains = ", ".join(f"{gain} over {label}" for label, gain in psd_gains(best))
        out.append(f"Best k of each mode: {summary} tok/s." + (f" **psd: {gains}.**" if gains else ""))
        out.append("")
    return "\n".join(out).rstrip("\n")
