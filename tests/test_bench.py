"""The benchmark harness: workload formats, metric definitions, and one real tiny run."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest

from minedraft.bench.doc_regions import regenerate, replace_region
from minedraft.bench.driver import RequestTiming
from minedraft.bench.report import (overlap_ceiling, percentile, psd_against_sd, request_metrics,
                                    step_metrics)
from minedraft.bench.table import markdown_table, terminal_table
from minedraft.bench.workload import load_prompts
from minedraft.metrics import AcceptanceStats

ROOT = Path(__file__).resolve().parents[1]


def test_workload_formats(tmp_path):
    sharegpt = tmp_path / "sg.json"
    sharegpt.write_text(json.dumps([
        {"conversations": [{"from": "system", "value": "s"}, {"from": "human", "value": "hi"},
                           {"from": "gpt", "value": "x"}]},
        {"conversations": [{"from": "gpt", "value": "only an answer"}]}]))
    assert load_prompts(str(sharegpt), 3) == ["hi", "hi", "hi"]
    specbench = tmp_path / "question.jsonl"
    specbench.write_text('{"question_id": 1, "turns": ["a", "b"]}\n{"turns": ["c"]}\n')
    assert load_prompts(str(specbench), 2) == ["a", "c"]
    plain = tmp_path / "p.jsonl"
    plain.write_text('{"prompt": "p1"}\n"p2"\nnot json\n')
    assert load_prompts(str(plain), 3) == ["p1", "p2", "not json"]
    assert len(load_prompts(None, 5)) == 5
    empty = tmp_path / "e.jsonl"
    empty.write_text("{}\n")
    with pytest.raises(ValueError, match="no prompts"):
        load_prompts(str(empty), 1)


def test_request_metrics():
    timings = [RequestTiming(0.0, 0.1, 1.0, 10, [], AcceptanceStats(4, 12, 6, [4, 4, 4], [3, 2, 1])),
               RequestTiming(0.5, 0.2, 2.5, 5, [], AcceptanceStats(2, 6, 0, [2, 2, 2], [0, 0, 0]))]
    m = request_metrics(timings, wall_s=2.5)
    assert m["output_tokens_per_s"] == pytest.approx(15 / 2.5)
    assert m["latency_p50_s"] == pytest.approx(1.5) and m["latency_p99_s"] == pytest.approx(1.99)   # interpolated
    assert m["mean_acceptance_length"] == pytest.approx((6 + 6) / 6)    # bonus included
    assert m["acceptance_rate"] == pytest.approx(6 / 18)
    assert m["tpot_mean_s"] == pytest.approx(((1.0 - 0.1) / 9 + (2.0 - 0.2) / 4) / 2)
    assert m["acceptance_rate_per_position"] == pytest.approx([3 / 6, 2 / 6, 1 / 6])
    assert percentile([3, 1, 2], 50) == 2 and percentile([4.0], 99) == 4.0 and math.isnan(percentile([], 50))
    assert timings[0].acceptance.num_steps == 4      # merging into the run's total leaves requests alone


def test_plain_decoding_scores_one():
    """ar records no steps at all (the gateway counts only steps that drafted); a step that
    drafted nothing emits one token. Both read 1.0, as minedraft.metrics defines it."""
    no_steps = [RequestTiming(0.0, 0.1, 1.0, 8, [], AcceptanceStats())]
    undrafted = [RequestTiming(0.0, 0.1, 1.0, 8, [], AcceptanceStats(num_steps=8))]
    for timings in (no_steps, undrafted):
        m = request_metrics(timings, wall_s=1.0)
        assert m["mean_acceptance_length"] == 1.0 and m["acceptance_rate"] == 0.0
        assert m["acceptance_rate_per_position"] == []


def test_step_metrics_and_ceiling():
    # sd: a draft call, then its verify; the gateway's gaps are between and around them.
    sd = [{"start_s": 0.000, "wall_s": 0.012, "draft_busy_s": 0.010, "draft_batch": 8, "kind": "draft"},
          {"start_s": 0.013, "wall_s": 0.022, "verify_busy_s": 0.020, "verify_batch": 8, "kind": "verify"}]
    # psd: a verify (queued early, so its call is long) with a draft of the other batch inside it.
    psd = [{"start_s": 0.035, "wall_s": 0.020, "verify_busy_s": 0.014, "data_plane_s": 0.001,
            "verify_batch": 4, "kind": "verify"},
           {"start_s": 0.041, "wall_s": 0.009, "draft_busy_s": 0.008, "draft_batch": 4, "kind": "draft"}]
    c = overlap_ceiling(sd, psd, 8)
    assert c["ceiling"] == pytest.approx((0.010 + 0.020) / (2 * 0.014))
    s = step_metrics(sd + psd)
    span = 0.055
    # busy: drafter [0.002, 0.012], verifier [0.015, 0.035], verifier [0.040, 0.055] (draft [0.042, 0.050] inside)
    assert s["gateway_share"] == pytest.approx((span - (0.010 + 0.020 + 0.015)) / span)
    assert s["data_plane_share"] == pytest.approx(0.001 / span)
    assert s["verifier_busy_share"] == pytest.approx(0.034 / span)
    assert s["steps"] == 2 and s["overlap_steps"] == 1


def test_ceiling_at_concurrency_one_is_nan():
    """At C = 1 psd holds one batch of 1: no half batch, so no ceiling; psd/sd still stands.
    Step records carry every field, unset ones as 0, which must not read as batches of 0."""
    steps = [{"start_s": 0.0, "wall_s": 0.006, "kind": "draft", "draft_busy_s": 0.005, "draft_batch": 1,
              "verify_busy_s": 0.0, "verify_batch": 0},
             {"start_s": 0.006, "wall_s": 0.011, "kind": "verify", "verify_busy_s": 0.010, "verify_batch": 1,
              "draft_busy_s": 0.0, "draft_batch": 0}]
    assert math.isnan(overlap_ceiling(steps, steps, 1)["ceiling"])
    row = psd_against_sd({"output_tokens_per_s": 90.0}, steps, {"output_tokens_per_s": 100.0}, steps, 1)
    assert row["psd_over_sd"] == pytest.approx(0.9)
    assert math.isnan(row["of_ceiling"]) and math.isnan(row["overlap_efficiency"])


def test_tables_share_their_columns():
    psd = {"mode": "psd", "k": 4, "concurrency": 8, "output_tokens_per_s": 449.46, "requests_per_s": 7.0,
           "latency_p50_s": 0.94, "latency_p99_s": 1.39, "ttft_p50_s": 0.16, "tpot_mean_s": 0.0129,
           "mean_acceptance_length": 3.44, "gateway_share": 0.04, "data_plane_share": 0.011,
           "ceiling": 1.13, "psd_over_sd": 1.13, "overlap_efficiency": float("nan"), "same_as_ar": True}
    ar = {**psd, "mode": "ar", "k": 0, "output_tokens_per_s": 433.8}
    for key in ("ceiling", "psd_over_sd", "overlap_efficiency"):
        del ar[key]
    table = markdown_table([ar, psd], top=psd)
    assert table[3] == ("| psd | 4 | **449.5** | 0.94 | 1.39 | 0.16 | 12.9 | 3.44 | 4.0 | 1.1 | 1.13 | "
                        "1.13 | nan |")
    assert table[2].endswith("| 4.0 | 1.1 |  |  |  |")        # ar: no ceiling to show
    printed = terminal_table([ar, psd], 8).splitlines()
    assert printed[-2].split() == ["psd", "4", "449.5", "7.00", "0.94", "1.39", "0.16", "12.9", "3.44", "4.0",
                                   "1.1", "1.13", "1.13", "nan", "yes"]
    assert printed[-1] == "headline: psd: +4% against the best fixed setting (ar)"
    assert "psd as 2 x 4" in printed[1] and "one batch of 1" in terminal_table([], 1)


def test_docs_quote_the_committed_run():
    """README.md's summary and docs/benchmarks.md's tables are what the committed bench.json
    gives: regenerating them changes nothing (scripts/bench_table.py ... --write)."""
    report = json.loads((ROOT / "docs" / "results" / "bench" / "bench.json").read_text())
    for path, text in regenerate(report, ROOT).items():
        assert text == path.read_text(), f"{path.name} is stale: run scripts/bench_table.py --write"
    with pytest.raises(ValueError, match="region"):
        replace_region("no markers here", "bench-tables", "")


def test_bench_cli_tiny_run(tmp_path):
    from minedraft.cli import main

    rc = main(["bench", "--modes", "ar", "sd", "psd", "--k", "2", "--concurrency", "2", "--num-prompts", "4",
               "--max-tokens", "8", "--rounds", "2", "--warmup-s", "0", "--out", str(tmp_path)])
    assert rc == 0
    report = json.loads((tmp_path / "bench.json").read_text())
    assert "partial" not in report
    rows = {r["mode"]: r for r in report["runs"]}
    assert set(rows) == {"ar", "sd", "psd"} and all(r["same_as_ar"] for r in rows.values())
    assert all(r["rounds"] == 2 and len(r["tokens_per_s_rounds"]) == 2 for r in rows.values())
    assert rows["psd"]["output_tokens_per_s"] == pytest.approx(sum(rows["psd"]["tokens_per_s_rounds"]) / 2)
    for key in ("output_tokens_per_s", "latency_p99_s", "ttft_p50_s", "tpot_mean_s", "gateway_share",
                "data_plane_share", "drafter_idle_share", "mean_acceptance_length", "step_records",
                "acceptance_rate_per_position"):
        assert key in rows["psd"], key
    assert rows["psd"]["ceiling"] > 0 and rows["psd"]["output_tokens"] == 4 * 8
    assert len(rows["psd"]["acceptance_rate_per_position"]) == 2
    assert report["environment"]["torch"]
    assert report["environment"]["processor"] not in ("", "unknown")   # runs on two CPU models differ
    assert {p.name for p in tmp_path.glob("*.png")} == {"vs_k_c2.png", "vs_concurrency.png",
                                                        "timeline_psd_k2_c2.png"}


def test_warm_up_runs_before_the_measured_run_and_is_not_counted(tmp_path):
    """--warmup-s: the server serves the run's prompts for that long first (its step ids have
    moved well past the four-token readiness request's), and nothing of it enters the
    run's figures or step records: they count the same steps as a run from a cold start."""
    from minedraft.cli import main

    rows = {}
    for warmup in ("0", "1"):
        assert main(["bench", "--modes", "ar", "--concurrency", "2", "--num-prompts", "4", "--max-tokens", "8",
                     "--warmup-s", warmup, "--out", str(tmp_path / warmup)]) == 0
        rows[warmup] = json.loads((tmp_path / warmup / "bench.json").read_text())["runs"][0]
    steps = {w: [s for s in row["step_records"] if s["kind"] == "verify"] for w, row in rows.items()}
    assert rows["0"]["output_tokens"] == rows["1"]["output_tokens"] == 4 * 8
    # ar runs one step per token of each request, and at most one more in flight past its last:
    # no step of the warm-up's (nor of the readiness request's) is counted.
    assert all(4 * 8 <= sum(s["verify_batch"] for s in steps[w]) <= 4 * 9 for w in steps)
    # The readiness request takes a few steps; a second of warm-up at C = 2 many more.
    assert min(s["step_id"] for s in steps["0"]) < 8 < 4 + 2 * 8 < min(s["step_id"] for s in steps["1"])
    assert main(["bench", "--warmup-s", "-1", "--out", str(tmp_path)]) == 2


def test_gpu_script_dry_run_on_cpu(tmp_path):
    """The GPU check's whole path (configs, data plane, random weights, synthetic acceptance)."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "gpu"
    import os
    import sys

    proc = subprocess.run(["bash", str(root / "scripts" / "gpu_check.sh"), str(out), "--device", "cpu"],
                          capture_output=True, text=True, timeout=600, cwd=root,
                          env={**os.environ, "PYTHON": sys.executable})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "bit-exact=True" in (out / "data_plane.txt").read_text()
    assert "greedy tokens equal=True" in (out / "tensor_parallel.txt").read_text()
    assert "-> OK" in (out / "tensor_parallel.txt").read_text()
    report = json.loads((out / "bench.json").read_text())
    assert {r["mode"] for r in report["runs"]} == {"ar", "sd", "psd"}
    assert report["config"]["synthetic_acceptance"] == [0.8] and report["config"]["random_weights"]
    psd = next(r for r in report["runs"] if r["mode"] == "psd")
    assert psd["mean_acceptance_length"] > 1.5        # synthetic acceptance works on random weights


def test_bench_against_running_server_and_unequal_label(tmp_path):
    from minedraft.cli import main
    from minedraft.launcher import Cluster, ServeConfig

    with Cluster(ServeConfig(mode="psd", k=3, max_batch=2, port=0)) as cluster:
        assert main(["bench", "--server", cluster.address, "--concurrency", "2", "--num-prompts", "4",
                     "--max-tokens", "8", "--warmup-s", "0", "--out", str(tmp_path / "server")]) == 0
    runs = json.loads((tmp_path / "server" / "bench.json").read_text())["runs"]
    assert [(r["mode"], r["k"]) for r in runs] == [("psd", 3)] and runs[0]["output_tokens"] == 32
    assert main(["bench", "--modes", "sd", "psd", "--k", "2", "--concurrency", "2", "--num-prompts", "2",
                 "--max-tokens", "4", "--unequal", "--warmup-s", "0", "--out", str(tmp_path / "unequal")]) == 0
    rows = json.loads((tmp_path / "unequal" / "bench.json").read_text())["runs"]
    unequal = next(r for r in rows if r["mode"] == "psd-2xC")
    assert unequal["concurrency"] == 4 and "UNEQUAL" in unequal["label"]


def test_a_stopped_sweep_keeps_the_concurrencies_it_measured(tmp_path, monkeypatch):
    """bench.json is written after each concurrency (marked partial), so stopping a long
    sweep, here as SIGTERM or Ctrl-C would during the second, loses only what was running."""
    from minedraft.bench import main as bench_main
    from minedraft.cli import main

    measure = bench_main.measure_concurrency

    def stopped_at_four(specs, concurrency, *rest):
        if concurrency == 4:
            raise KeyboardInterrupt
        return measure(specs, concurrency, *rest)

    monkeypatch.setattr(bench_main, "measure_concurrency", stopped_at_four)
    rc = main(["bench", "--modes", "ar", "--concurrency", "2", "4", "--num-prompts", "4", "--max-tokens", "8",
               "--warmup-s", "0", "--out", str(tmp_path)])
    assert rc == 130
    report = json.loads((tmp_path / "bench.json").read_text())
    assert report["partial"] is True
    assert [(r["mode"], r["concurrency"], r["output_tokens"]) for r in report["runs"]] == [("ar", 2, 32)]
    assert not (tmp_path / "bench.json.part").exists()


def test_the_pace_after_a_run_waits_for_the_steps_pipelined_past_its_end():
    """The probe after a run must not share the cores with plain decoding's last steps in
    flight: wait_for_quiet returns only once the newest step record stops changing (or at
    its limit, for a gateway that never goes quiet)."""
    from minedraft.bench.main import wait_for_quiet

    class Stepping:
        def __init__(self, steps_left: int) -> None:
            self.step, self.steps_left, self.calls = 0, steps_left, 0

        def step_stats(self, max_steps: int = 0):
            assert max_steps == 1                       # polled with the newest record only
            self.calls += 1
            if self.steps_left:
                self.steps_left -= 1
                self.step += 1
            return [{"step_id": self.step}]

    client = Stepping(steps_left=3)
    wait_for_quiet(client, quiet_s=0.001)
    assert client.steps_left == 0 and client.calls == 4     # three new records, then one unchanged
    busy = Stepping(steps_left=10 ** 9)
    start = time.monotonic()
    wait_for_quiet(busy, quiet_s=0.001, limit_s=0.05)
    assert 0.05 <= time.monotonic() - start < 1.0

    class SlowSteps(Stepping):              # steps of 0.1 s: a quiet spell shorter than one proves nothing
        def step_stats(self, max_steps: int = 0):
            return [{**record, "wall_s": 0.1} for record in super().step_stats(max_steps)]

    slow = SlowSteps(steps_left=2)
    start = time.monotonic()
    wait_for_quiet(slow, quiet_s=0.001)
    assert time.monotonic() - start >= 0.4 and slow.calls == 3     # two waits of twice a step


def test_a_runs_step_records_are_the_steps_after_the_newest_before_it_though_the_ring_wrapped():
    """Records are picked by step id: the gateway keeps a ring of them, and a count taken
    before a run points past the run's records once the ring has wrapped."""
    from minedraft.bench.main import settled_newest_step, steps_after

    class Ring:
        def __init__(self, size: int) -> None:
            self.size, self.records = size, []

        def step(self, n: int) -> None:
            start = self.records[-1]["step_id"] + 1 if self.records else 1
            self.records = (self.records + [{"step_id": i, "kind": "verify"} for i in range(start, start + n)])[-self.size:]

        def step_stats(self, max_steps: int = 0):
            return self.records[-max_steps:] if max_steps else list(self.records)

    ring = Ring(size=5)
    assert settled_newest_step(ring, quiet_s=0.001) == -1 and steps_after(ring, -1) == []
    ring.step(4)
    before = settled_newest_step(ring, quiet_s=0.001)
    ring.step(3)                                        # the run: steps 5-7, the ring holds 3-7
    assert before == 4 and [s["step_id"] for s in steps_after(ring, before)] == [5, 6, 7]


def test_paired_summary_pairs_auto_with_each_passes_best_fixed_setting():
    """Ratios are taken within a pass, against whichever fixed setting was fastest in it (a
    different one per pass here), and the p50 against that same setting's."""
    from minedraft.bench.paired import summarise

    def run(index, tps, p50, same=True):
        return {"pass": index, "started_s": float(index), "tokens_per_s": tps, "latency_p50_s": p50, "same_as_ar": same}

    runs = {"auto": [{**run(0, 100, 0.50), "layout_share": {"ar": 1.0}, "lent_share": 1.0},
                     {**run(1, 120, 0.40), "layout_share": {"ar": 0.7, "psd": 0.3}, "lent_share": 0.5},
                     {**run(2, 90, 0.60), "layout_share": {"ar": 1.0}, "lent_share": 0.0}],
            "ar": [run(0, 110, 0.45), run(1, 100, 0.50), run(2, 100, 0.50)],
            "sd k=2": [run(0, 90, 0.55), run(1, 130, 0.38), run(2, 80, 0.70, same=False)]}
    summary = summarise(runs)
    assert summary["best_fixed_per_pass"] == ["ar", "sd k=2", "ar"]
    assert summary["auto_over_best_fixed"]["median"] == pytest.approx(100 / 110)
    assert summary["auto_over_best_fixed"]["min"] == pytest.approx(90 / 100)
    assert summary["auto_over_best_fixed"]["max"] == pytest.approx(120 / 130)
    assert summary["auto_p50_over_best_fixed"]["median"] == pytest.approx(0.50 / 0.45)   # of 1.11, 1.05, 1.2
    assert summary["auto_over"]["ar"]["median"] == pytest.approx(100 / 110)
    # ar's median is 100 against sd k=2's 90: the best setting over the passes, which each
    # pass's best stood above only in pass 1 (130 against 100).
    assert summary["best_fixed"] == "ar"
    assert summary["auto_over_best_setting"]["median"] == pytest.approx(100 / 110)
    assert summary["auto_over_best_setting"]["max"] == pytest.approx(1.2)
    assert summary["pass_best_over_best_setting"]["max"] == pytest.approx(1.3)
    assert summary["pass_best_over_best_setting"]["median"] == pytest.approx(1.0)
    assert summary["auto_over"]["sd k=2"]["median"] == pytest.approx(100 / 90)
    settings = summary["settings"]
    assert settings["ar"]["tokens_per_s"]["median"] == 100 and settings["auto"]["tokens_per_s"]["max"] == 120
    assert settings["ar"]["same_as_ar"] is True and settings["sd k=2"]["same_as_ar"] is False
    assert summary["auto_layout_share"] == pytest.approx({"ar": 0.9, "psd": 0.1})
    assert summary["auto_lent_share"] == pytest.approx(0.5)
    assert "auto_over" not in summarise({name: rs for name, rs in runs.items() if name != "auto"})
    assert "control_over_ar" not in summary
    # A second ar (--paired-control) is set against the first, and is none of auto's fixed settings.
    controlled = summarise({**runs, "ar (control)": [run(0, 99, 0.5), run(1, 150, 0.3), run(2, 95, 0.5)]})
    assert controlled["control_over_ar"]["median"] == pytest.approx(0.95)
    assert controlled["control_over_ar"]["max"] == pytest.approx(1.5)
    assert controlled["best_fixed_per_pass"] == summary["best_fixed_per_pass"]
    assert set(controlled["auto_over"]) == {"ar", "sd k=2"}


def test_paired_cli_keeps_every_setting_up_and_alternates_their_runs(tmp_path):
    from minedraft.cli import main

    assert main(["bench", "--modes", "auto", "ar", "--concurrency", "2", "--paired", "3", "--num-prompts", "4",
                 "--max-tokens", "8", "--warmup-s", "0", "--paired-control", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "paired.json").read_text())
    (at_c2,) = report["concurrency"]
    runs = at_c2["runs"]
    assert set(runs) == {"auto", "ar", "ar (control)"} and all(len(rs) == 3 for rs in runs.values())
    assert all(r["same_as_ar"] is True for rs in runs.values() for r in rs)
    # auto's runs say what it chose, when and on what predictions (each run's own decisions).
    for run in runs["auto"]:
        assert run["layout_changes"] and all(c["layout"] in ("ar", "sd", "psd") for c in run["layout_changes"])
        assert all(c["at_s"] > -1.0 for c in run["layout_changes"]) and set(run["layout_slowdown"]) <= {"ar", "sd", "psd"}
    assert all("layout_changes" not in r for r in runs["ar"])
    # auto, ar, the control; the next pass the other way round; and so on.
    order = sorted(((r["started_s"], name) for name, rs in runs.items() for r in rs))
    assert [name for _, name in order] == ["auto", "ar", "ar (control)", "ar (control)", "ar", "auto",
                                           "auto", "ar", "ar (control)"]
    ratios = sorted(a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(runs["auto"], runs["ar"]))
    assert at_c2["auto_over"]["ar"]["median"] == pytest.approx(ratios[1])
    assert set(at_c2["auto_over"]) == {"ar"}
    controls = sorted(c["tokens_per_s"] / a["tokens_per_s"] for c, a in zip(runs["ar (control)"], runs["ar"]))
    assert at_c2["control_over_ar"]["median"] == pytest.approx(controls[1])
    assert at_c2["best_fixed"] == "ar" and at_c2["auto_over_best_setting"] == at_c2["auto_over"]["ar"]
    assert (tmp_path / "paired.png").stat().st_size > 0
    for refused in (["--paired", "1"], ["--paired", "2", "--peers"], ["--paired", "2", "--rounds", "2"],
                    ["--paired", "2", "--request-rate", "4"], ["--paired-control"]):
        assert main(["bench", "--modes", "ar", *refused, "--out", str(tmp_path / "refused")]) == 2
    assert main(["bench", "--modes", "auto", "--paired", "2", "--paired-control",
                 "--out", str(tmp_path / "refused")]) == 2
