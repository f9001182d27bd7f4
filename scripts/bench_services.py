"""AR, SD and PSD served by the real services, at equal concurrency, side by side.

For each concurrency C: `ar` and `sd` hold the C requests as one batch, `psd` as two
batches of C/2. From the services' own step timings it derives the drafter time t and
verifier time V per step at batch C (from sd) and C/2 (from psd), the analytic ceiling of
overlap [t(C) + V(C)] / [2 max(t(C/2), V(C/2))], and the gateway's own share of a step
(everything outside drafter and verifier compute and the data-plane transfer).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from minedraft import bundled
from minedraft.client import Client
from minedraft.launcher import Cluster, ServeConfig


def run_mode(mode: str, k: int, concurrency: int, prompts: list[str], max_tokens: int,
             data_plane: str = "gloo") -> dict:
    m = concurrency // 2 if mode == "psd" else concurrency
    with Cluster(ServeConfig(mode=mode, k=k, max_batch=m, port=0, data_plane=data_plane)) as cluster, \
            Client(cluster.address, timeout=900) as client:
        client.generate(prompts[0], max_tokens=8)                      # warm-up
        warm_steps = len(client.step_stats())
        start = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            results = list(pool.map(lambda p: client.generate(p, max_tokens=max_tokens, ignore_eos=True), prompts))
        elapsed = time.perf_counter() - start
        steps = client.step_stats()[warm_steps:]
    tokens = sum(len(r.token_ids) for r in results)
    drafted = sum(r.stats.num_accepted + r.stats.num_steps for r in results)
    nsteps = sum(r.stats.num_steps for r in results)
    return {"mode": mode, "k": k, "concurrency": concurrency, "m": m, "tokens": tokens,
            "seconds": elapsed, "tokens_per_s": tokens / elapsed,
            "mean_acceptance_length": drafted / nsteps if mode != "ar" and nsteps else 1.0,
            "steps": steps, "token_ids": [r.token_ids for r in results]}


def step_costs(run: dict, batch: int) -> tuple[float, float]:
    """Median drafter busy time t and verifier busy time V at exactly `batch` requests."""
    drafts = [s["draft_busy_s"] for s in run["steps"] if s.get("draft_batch") == batch]
    verifies = [s["verify_busy_s"] for s in run["steps"] if s.get("verify_batch") == batch]
    return (statistics.median(drafts) if drafts else float("nan"),
            statistics.median(verifies) if verifies else float("nan"))


def gateway_share(run: dict) -> float:
    """Gateway's own time / step wall time, summed over the run's steps."""
    own = wall = 0.0
    for s in run["steps"]:
        busy = max(s.get("draft_busy_s", 0.0), s.get("verify_busy_s", 0.0) + s.get("data_plane_s", 0.0))
        own += max(0.0, s["wall_s"] - busy)
        wall += s["wall_s"]
    return own / wall if wall else 0.0


def data_plane_share(run: dict) -> float:
    wall = sum(s["wall_s"] for s in run["steps"])
    return sum(s.get("data_plane_s", 0.0) for s in run["steps"]) / wall if wall else 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--k", type=int, nargs="+", default=[2, 4, 6, 8])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--waves", type=int, default=2, help="requests = waves x concurrency")
    parser.add_argument("--data-plane", default="gloo", choices=["gloo", "inband"])
    parser.add_argument("--json", help="write every number here")
    args = parser.parse_args()
    report = {"config": vars(args), "results": []}
    for c in args.concurrency:
        prompts = (bundled.load_prompts() * 4)[:c * args.waves]
        runs = {("ar", 0): run_mode("ar", 0, c, prompts, args.max_tokens)}
        for k in args.k:
            for mode in ("sd", "psd"):
                runs[(mode, k)] = run_mode(mode, k, c, prompts, args.max_tokens, args.data_plane)
                print(f"C={c} {mode} k={k}: {runs[(mode, k)]['tokens_per_s']:.1f} tok/s", flush=True)
        reference = runs[("ar", 0)]["token_ids"]
        best = {mode: max((r for (m_, _), r in runs.items() if m_ == mode), key=lambda r: r["tokens_per_s"])
                for mode in ("ar", "sd", "psd")}
        print(f"\n== concurrency {c} (psd: 2 x {c // 2}; sd, ar: 1 x {c}), {len(prompts)} requests x "
              f"{args.max_tokens} tokens ==")
        print(f"{'mode':<5}{'k':>3}{'tok/s':>9}{'MAL':>6}{'t(C)ms':>8}{'V(C)ms':>8}{'t(C/2)':>8}{'V(C/2)':>8}"
              f"{'ceiling':>9}{'psd/sd':>8}{'of ceil.':>9}{'gw %':>6}{'dp %':>6}  ==ar")
        for (mode, k), run in runs.items():
            row = {"mode": mode, "k": k, "concurrency": c, "tokens_per_s": run["tokens_per_s"],
                   "mean_acceptance_length": run["mean_acceptance_length"],
                   "gateway_share": gateway_share(run), "data_plane_share": data_plane_share(run),
                   "same_as_ar": run["token_ids"] == reference}
            line = f"{mode:<5}{k:>3}{run['tokens_per_s']:>9.1f}{run['mean_acceptance_length']:>6.2f}"
            if mode == "psd":
                sd = runs[("sd", k)]
                t_c, v_c = step_costs(sd, c)
                t_h, v_h = step_costs(run, c // 2)
                ceiling = (t_c + v_c) / (2 * max(t_h, v_h))
                ratio = run["tokens_per_s"] / sd["tokens_per_s"]
                row.update(t_c_ms=t_c * 1e3, v_c_ms=v_c * 1e3, t_half_ms=t_h * 1e3, v_half_ms=v_h * 1e3,
                           ceiling=ceiling, psd_over_sd=ratio, fraction_of_ceiling=ratio / ceiling)
                line += (f"{t_c * 1e3:>8.1f}{v_c * 1e3:>8.1f}{t_h * 1e3:>8.1f}{v_h * 1e3:>8.1f}"
                         f"{ceiling:>9.3f}{ratio:>8.3f}{ratio / ceiling:>9.3f}")
            else:
                line += " " * 58
            line += f"{row['gateway_share'] * 100:>6.1f}{row['data_plane_share'] * 100:>6.1f}  " \
                    f"{'yes' if row['same_as_ar'] else 'NO'}"
            print(line)
            report["results"].append(row)
        print("best k: " + ", ".join(f"{m_} k={r['k']} {r['tokens_per_s']:.1f} tok/s" for m_, r in best.items())
              + "\n", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
