"""PNG plots of a benchmark run (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path

from minedraft.constants import BENCH_MODES


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_vs_k(rows: list[dict], out: Path) -> list[Path]:
    plt = _pyplot()
    rows = [r for r in rows if r["mode"] in BENCH_MODES]     # equal concurrency only
    written = []
    for concurrency in sorted({r["concurrency"] for r in rows}):
        fig, (ax_tps, ax_p99) = plt.subplots(1, 2, figsize=(10, 4))
        for mode in sorted({r["mode"] for r in rows}):
            pts = sorted((r["k"], r["output_tokens_per_s"], r["latency_p99_s"]) for r in rows
                         if r["mode"] == mode and r["concurrency"] == concurrency)
            ks = [p[0] for p in pts]
            style = "--" if mode == "ar" else "-o"
            if mode == "ar" and len(pts) == 1:
                ks = sorted({r["k"] for r in rows if r["k"]}) or [0]
                pts = [pts[0]] * len(ks)
            ax_tps.plot(ks, [p[1] for p in pts], style, label=mode)
            ax_p99.plot(ks, [p[2] for p in pts], style, label=mode)
        ax_tps.set(xlabel="draft length k", ylabel="output tokens/s", title=f"throughput, C={concurrency}")
        ax_p99.set(xlabel="draft length k", ylabel="p99 latency (s)", title=f"p99 latency, C={concurrency}")
        ax_tps.legend()
        fig.tight_layout()
        path = out / f"vs_k_c{concurrency}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def plot_vs_concurrency(rows: list[dict], out: Path) -> Path:
    plt = _pyplot()
    rows = [r for r in rows if r["mode"] in BENCH_MODES]     # equal concurrency only
    fig, ax = plt.subplots(figsize=(6, 4))
    for mode in sorted({r["mode"] for r in rows}):
        best = {}
        for r in rows:
            if r["mode"] == mode:
                c = r["concurrency"]
                best[c] = max(best.get(c, 0.0), r["output_tokens_per_s"])
        cs = sorted(best)
        ax.plot(cs, [best[c] for c in cs], "-o", label=f"{mode} (best k)")
    ax.set(xlabel="concurrency", ylabel="output tokens/s", title="throughput at equal concurrency")
    ax.legend()
    fig.tight_layout()
    path = out / "vs_concurrency.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


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
    fig.tight_layout()
    path = out / ("timeline_" + title.replace("=", "").replace(" ", "_").lower() + ".png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
