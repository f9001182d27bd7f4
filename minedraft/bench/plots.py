"""PNG plots of a benchmark run (matplotlib, headless)."""

from __future__ import annotations

import statistics
from pathlib import Path

from minedraft.bench.headline import GENERATE, ONE_CORE_AR, TOKENS_PER_S
from minedraft.bench.phases import Phase, phase_bounds
from minedraft.constants import LAYOUTS

# The modes run at equal concurrency, in drawing order: auto last, so it lies on top.
EQUAL_MODES = (ONE_CORE_AR, "ar", "sd", "sd-colocated", "psd", "auto")
# Modes with one k for the whole run (plain decoding, or auto's k_max): a flat line against k.
FLAT_STYLES = {"ar": "--", ONE_CORE_AR: ":", "auto": "-"}
AUTO_STYLE = dict(color="black", linewidth=3, zorder=5)


def _pyplot():
    from minedraft.extras import require

    matplotlib = require("matplotlib", "bench", "minedraft bench's plots")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _style(mode: str) -> dict:
    return dict(AUTO_STYLE) if mode == "auto" else {}


def _save(fig, path: Path) -> Path:
    """Lay the figure out, write it as a PNG and free it; -> the path."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
    return path


def _file_name(prefix: str, title: str) -> str:
    return prefix + title.replace("=", "").replace(" ", "_").lower() + ".png"


def plot_vs_k(rows: list[dict], out: Path) -> list[Path]:
    plt = _pyplot()
    rows = [r for r in rows if r["mode"] in EQUAL_MODES]     # equal concurrency only
    written = []
    for concurrency in sorted({r["concurrency"] for r in rows}):
        fig, (ax_tps, ax_p99) = plt.subplots(1, 2, figsize=(10, 4))
        here = [r for r in rows if r["concurrency"] == concurrency]
        swept = sorted({r["k"] for r in here if r["mode"] not in FLAT_STYLES}) or [0]
        for mode in (m for m in EQUAL_MODES if any(r["mode"] == m for r in here)):
            pts = sorted((r["k"], r[TOKENS_PER_S], r["latency_p99_s"]) for r in here if r["mode"] == mode)
            ks = [p[0] for p in pts]
            if mode in FLAT_STYLES:         # drawn across the k swept by the others
                ks, pts = swept, [max(pts, key=lambda p: p[1])] * len(swept)
            style = FLAT_STYLES.get(mode, "-o")
            label = f"{mode} (k_max {pts[0][0]})" if mode == "auto" else mode
            ax_tps.plot(ks, [p[1] for p in pts], style, label=label, **_style(mode))
            ax_p99.plot(ks, [p[2] for p in pts], style, label=label, **_style(mode))
        ax_tps.set(xlabel="draft length k", ylabel="output tokens/s", title=f"throughput, C={concurrency}")
        ax_p99.set(xlabel="draft length k", ylabel="p99 latency (s)", title=f"p99 latency, C={concurrency}")
        ax_tps.legend()
        path = _save(fig, out / f"vs_k_c{concurrency}.png")
        written.append(path)
    return written


def plot_vs_concurrency(rows: list[dict], out: Path) -> Path:
    """Each mode at its best k against concurrency, transformers' generate dotted, auto on
    top in a thick black line."""
    plt = _pyplot()
    rows = [r for r in rows if r["mode"] in (GENERATE, *EQUAL_MODES)]     # equal concurrency only
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for mode in (m for m in (GENERATE, *EQUAL_MODES) if any(r["mode"] == m for r in rows)):
        best: dict[int, float] = {}
        for r in rows:
            if r["mode"] == mode:
                best[r["concurrency"]] = max(best.get(r["concurrency"], 0.0), r[TOKENS_PER_S])
        cs = sorted(best)
        label = "transformers generate" if mode == GENERATE else mode if mode in FLAT_STYLES else f"{mode} (best k)"
        ax.plot(cs, [best[c] for c in cs], ":o" if mode == GENERATE else "-o", label=label, **_style(mode))
    concurrencies = sorted({r["concurrency"] for r in rows})
    if len(concurrencies) > 1 and concurrencies[-1] >= 4 * concurrencies[0]:
        ax.set_xscale("log", base=2)
        ax.set_xticks(concurrencies, labels=[str(c) for c in concurrencies])
    ax.set(xlabel="concurrency", ylabel="output tokens/s", title="throughput at equal concurrency")
    ax.legend()
    path = _save(fig, out / "vs_concurrency.png")
    return path


def _draw_rate(ax, phases: list[Phase]) -> None:
    bounds = phase_bounds(phases)
    xs = [start for start, _ in bounds] + [bounds[-1][1]]
    ax.step(xs, [p.rate for p in phases] + [phases[-1].rate], where="post", color="tab:gray")
    ax.set(ylabel="arrivals/s")


def plot_auto(steps: list[dict], title: str, out: Path, phases: list[Phase] | None = None,
              schedule_start_s: float | None = None, history: list[dict] | None = None) -> Path | None:
    """What auto chose over the run: the layout of each step, what it predicted each layout
    would give when it decided (`history`: AutoPlan.history, on the steps' clock; trials
    marked), its requests' mean and longest draft length, and the offered rate where it
    stepped (the schedule's start placed at the first request's first step); None for a run
    with no auto steps."""
    from minedraft.bench.report import auto_steps

    chosen = auto_steps(steps)
    if not chosen:
        return None
    plt = _pyplot()
    origin = schedule_start_s if schedule_start_s is not None else chosen[0][0]
    times = [start - origin for start, _, _ in chosen]
    decisions = [d for d in history or [] if d["at_s"] <= chosen[-1][0]]
    panels = 2 + bool(decisions) + bool(phases)
    fig, axes = plt.subplots(panels, 1, figsize=(10, 1.8 * panels + 1), sharex=True)
    ax_layout, ax_k = axes[0], axes[2 if decisions else 1]
    ax_layout.plot(times, [LAYOUTS.index(layout) if layout in LAYOUTS else -1 for _, layout, _ in chosen],
                   "|", markersize=8, color="black")
    ax_layout.set_yticks(range(len(LAYOUTS)), labels=list(LAYOUTS))
    ax_layout.set_ylim(-0.5, len(LAYOUTS) - 0.5)
    ax_layout.set(ylabel="layout", title=title)
    if decisions:
        _draw_predictions(axes[1], decisions, origin)
    ax_k.plot(times, [sum(ks) / len(ks) if ks else 0 for _, _, ks in chosen], ".", markersize=3, label="mean k")
    ax_k.plot(times, [max(ks, default=0) for _, _, ks in chosen], "_", markersize=6, alpha=0.7, label="max k")
    ax_k.set(ylabel="draft length")
    ax_k.legend(loc="upper right")
    if phases:
        _draw_rate(axes[-1], phases)
    axes[-1].set(xlabel="s since the run's start")
    path = _save(fig, out / _file_name("", title))
    return path


def _draw_predictions(ax, decisions: list[dict], origin: float) -> None:
    """Each layout's predicted tok/s at every decision; a ring where that layout was chosen,
    a cross where it was chosen as a trial."""
    times = [d["at_s"] - origin for d in decisions]
    for layout in LAYOUTS:
        rates = [d["layout_tokens_per_s"].get(layout) for d in decisions]
        if not any(rate is not None for rate in rates):
            continue
        line, = ax.plot(times, [float("nan") if r is None else r for r in rates], "-", linewidth=1, label=layout)
        for marker, trial in (("o", False), ("x", True)):
            picked = [(t, r) for t, r, d in zip(times, rates, decisions)
                      if d["layout"] == layout and bool(d.get("trying")) == trial and r is not None]
            if picked:
                ax.plot(*zip(*picked), marker, markersize=4, fillstyle="none", color=line.get_color())
    ax.set(ylabel="predicted tok/s")
    ax.legend(loc="upper right", title="o chosen, x trial", fontsize="small", title_fontsize="small")


def plot_rate_steps(rows: list[dict], phases: list[Phase], out: Path) -> list[Path]:
    """Per concurrency: each mode's output tokens/s over time (its best k, 1 s bins) under a
    rate that steps, with the offered rate below."""
    plt = _pyplot()
    written = []
    rows = [r for r in rows if r.get("tokens_per_s_series")]
    for concurrency in sorted({r["concurrency"] for r in rows}):
        here = [r for r in rows if r["concurrency"] == concurrency]
        fig, (ax_tps, ax_rate) = plt.subplots(2, 1, figsize=(10, 5), sharex=True, height_ratios=(3, 1))
        for mode in (m for m in EQUAL_MODES if any(r["mode"] == m for r in here)):
            best = max((r for r in here if r["mode"] == mode), key=lambda r: r[TOKENS_PER_S])
            series = best["tokens_per_s_series"]
            ax_tps.plot(range(len(series)), series, label=f"{mode} k={best['k']}", **_style(mode))
        ax_tps.set(ylabel="output tokens/s", title=f"a stepping rate, C={concurrency}")
        ax_tps.legend()
        _draw_rate(ax_rate, phases)
        ax_rate.set(xlabel="s since the run's start")
        path = _save(fig, out / f"rate_steps_c{concurrency}.png")
        written.append(path)
    return written


def plot_timeline(steps: list[dict], title: str, out: Path, num_steps: int = 12) -> Path:
    """Drafter and verifier busy intervals over a window of verify steps from the middle of
    the run (each call's work placed just before its answer, see report.busy_intervals);
    light blue is a verify's wait for drafts, white is time neither service works."""
    from minedraft.bench.report import busy_intervals

    plt = _pyplot()
    ordered = sorted(steps, key=lambda c: c.get("start_s", 0.0) + c["wall_s"])
    verify_ends = [c.get("start_s", 0.0) + c["wall_s"] for c in ordered if c.get("kind") == "verify"]
    middle = max(0, len(verify_ends) // 2 - num_steps // 2)
    window = verify_ends[middle:middle + num_steps]
    fig, ax = plt.subplots(figsize=(10, 2.8))
    if window:
        lo, hi = window[0] - (window[1] - window[0] if len(window) > 1 else 0.02), window[-1]
        calls = [c for c in ordered if lo <= c.get("start_s", 0.0) + c["wall_s"] <= hi]
        drafter, _ = busy_intervals(calls)
        ax.broken_barh([((a - lo) * 1e3, (b - a) * 1e3) for a, b in drafter], (0.1, 0.85), facecolors="tab:orange")
        for c in calls:
            if c.get("kind") != "verify":
                continue
            end = c.get("start_s", 0.0) + c["wall_s"]
            compute = c.get("verify_busy_s", 0.0)
            wait = c.get("data_plane_s", 0.0)
            ax.broken_barh([((end - compute - wait - lo) * 1e3, wait * 1e3)], (1.05, 0.85), facecolors="lightblue")
            ax.broken_barh([((end - compute - lo) * 1e3, compute * 1e3)], (1.05, 0.85), facecolors="tab:blue")
    ax.set_yticks([0.5, 1.5], labels=["drafter", "verifier"])
    ax.set_xlim(left=0)
    ax.set(xlabel="ms", title=title)
    path = _save(fig, out / _file_name("timeline_", title))
    return path


def plot_paired(concurrencies: list[dict], out: Path) -> Path | None:
    """A paired run (paired.json's "concurrency" entries) against concurrency: above, each
    setting's median throughput over fixed `ar`'s, paired within passes (auto on top);
    below, auto over the best fixed setting and over each pass's best (median, IQR as bars),
    with the control's ratio to `ar` shaded where there was one: the band identical settings
    read apart. None without ar or auto."""
    from minedraft.bench.paired import AUTO, CONTROL

    rows = [c for c in concurrencies if "ar" in c["runs"] and "auto_over_best_setting" in c]
    if not rows:
        return None
    plt = _pyplot()
    cs = [c["concurrency"] for c in rows]
    fig, (ax_ar, ax_best) = plt.subplots(2, 1, figsize=(7, 7), sharex=True)
    names = [n for n in rows[0]["runs"] if n not in ("ar", AUTO, CONTROL)] + [AUTO]
    for name in names:
        ratios = [statistics.median(r["tokens_per_s"] / a["tokens_per_s"]
                                    for r, a in zip(c["runs"][name], c["runs"]["ar"]))
                  if name in c["runs"] else float("nan") for c in rows]
        ax_ar.plot(cs, ratios, "-o", label=name, **_style(name))
    ax_ar.axhline(1.0, color="tab:gray", linestyle="--", linewidth=1, label="ar (both cores)")
    ax_ar.set(ylabel="tok/s over ar's, same pass", title="paired runs: every setting warm at once")
    ax_ar.legend(fontsize="small")
    # (each series nudged sideways on the log axis, so the two sets of bars stay apart)
    for key, label, nudge, style in (("auto_over_best_setting", "auto / best fixed setting", 0.97, _style(AUTO)),
                                     ("auto_over_best_fixed", "auto / each pass's best", 1.03, {})):
        mid = [c[key]["median"] for c in rows]
        bars = [[m - c[key]["p25"] for m, c in zip(mid, rows)], [c[key]["p75"] - m for m, c in zip(mid, rows)]]
        ax_best.errorbar([x * nudge for x in cs], mid, yerr=bars, fmt="-o", capsize=3, label=label, **style)
    controlled = [c for c in rows if "control_over_ar" in c]
    if controlled:
        ax_best.fill_between([c["concurrency"] for c in controlled], [c["control_over_ar"]["p25"] for c in controlled],
                             [c["control_over_ar"]["p75"] for c in controlled], color="tab:gray", alpha=0.25,
                             label="ar (control) / ar, IQR")
    ax_best.axhline(0.97, color="tab:red", linestyle=":", linewidth=1, label="0.97")
    ax_best.set(xlabel="concurrency", ylabel="ratio, paired within passes")
    ax_best.legend(fontsize="small")
    if len(cs) > 1 and cs[-1] >= 4 * cs[0]:
        ax_best.set_xscale("log", base=2)
        ax_best.set_xticks(cs, labels=[str(c) for c in cs])
    return _save(fig, out / "paired.png")
