"""Markdown tables of a `minedraft bench` run, as docs/benchmarks.md shows them.

    python scripts/bench_table.py docs/results/bench/bench.json
"""

from __future__ import annotations

import json
import sys

HEADER = ("| mode | k | tok/s | p50 s | p99 s | TTFT s | TPOT ms | MAL | gw % | dp % | ceil | psd/sd | eff |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def _row(r: dict, best: bool) -> str:
    tok = f"**{r['output_tokens_per_s']:.1f}**" if best else f"{r['output_tokens_per_s']:.1f}"
    extra = (f"{r['ceiling']:.2f} | {r['psd_over_sd']:.2f} | {r['overlap_efficiency']:.2f}"
             if "ceiling" in r else " | | ")
    return (f"| {r['mode']} | {r['k']} | {tok} | {r['latency_p50_s']:.2f} | {r['latency_p99_s']:.2f} | "
            f"{r['ttft_p50_s']:.2f} | {r['tpot_mean_s'] * 1e3:.1f} | {r['mean_acceptance_length']:.2f} | "
            f"{r['gateway_share'] * 100:.1f} | {r['data_plane_share'] * 100:.1f} | {extra} |")


def tables(report: dict) -> str:
    runs = [r for r in report["runs"] if r["mode"] in ("ar", "sd", "sd-colocated", "psd")]
    out = []
    for concurrency in sorted({r["concurrency"] for r in runs}):
        rows = [r for r in runs if r["concurrency"] == concurrency]
        best = {}
        for r in rows:
            if r["mode"] not in best or r["output_tokens_per_s"] > best[r["mode"]]["output_tokens_per_s"]:
                best[r["mode"]] = r
        top = max(rows, key=lambda r: r["output_tokens_per_s"])
        out += [f"### Concurrency {concurrency}", "", HEADER]
        out += [_row(r, r is top) for r in rows]
        summary = ", ".join(f"{m} (k={b['k']}) {b['output_tokens_per_s']:.1f}" for m, b in best.items())
        psd = best.get("psd")
        gains = []
        for other, label in (("sd", "the best sd"), ("sd-colocated", "co-located sd"), ("ar", "ar")):
            if psd and other in best:
                gains.append(f"{(psd['output_tokens_per_s'] / best[other]['output_tokens_per_s'] - 1) * 100:+.0f}% "
                             f"over {label}")
        out += ["", f"Best k of each mode: {summary} tok/s." + (f" **psd: {', '.join(gains)}.**" if gains else ""),
                ""]
    return "\n".join(out)


if __name__ == "__main__":
    print(tables(json.loads(open(sys.argv[1]).read())))
