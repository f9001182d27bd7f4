"""The benchmark's parts for auto mode: the cost model's accuracy and auto's choices from step
records, a rate that steps, the mixed workload, the headline against the best fixed setting,
rounds (their order, medians and paired ratios), the sweep's run list, the number of prompts
and the memory-bound stand-in; and one real run of auto."""

from __future__ import annotations

import argparse
import itertools
import json
import math
from pathlib import Path

import pytest

from minedraft.bench.doc_regions import readme_summary, reproduce_command
from minedraft.bench.driver import RequestTiming
from minedraft.bench.headline import headline, runs_of
from minedraft.bench.main import add_parser, compare, workload_for
from minedraft.bench.pace import probe, probed, relative_paces
from minedraft.bench.phases import (Phase, parse_rate_steps, phase_metrics, poisson_arrivals,
                                    throughput_series)
from minedraft.bench.report import (acceptance_by_kind, auto_metrics, layout_changes, model_error, newest_decision,
                                    plain)
from minedraft.bench.rounds import fold_rows, fold_runs, median_row
from minedraft.bench.runs import (Progress, RunSpec, apply_presets, num_prompts, progress_line, round_order, run_list,
                                  serve_config, spread_modes)
from minedraft.bench.table import markdown_table, markdown_tables, overview_table, terminal_table
from minedraft.bench.workload import load_workload
from minedraft.metrics import AcceptanceStats


def bench_args(*argv: str) -> argparse.Namespace:
    return add_parser(argparse.ArgumentParser().add_subparsers()).parse_args(list(argv))


def test_model_error_per_kind():
    """median |predicted - measured| / measured, per kind, over records with a prediction only."""
    records = [
        {"kind": "draft", "draft_busy_s": 0.010, "predicted_busy_s": 0.011},     # 10%
        {"kind": "draft", "draft_busy_s": 0.010, "predicted_busy_s": 0.008},     # 20%
        {"kind": "draft", "draft_busy_s": 0.010, "predicted_busy_s": 0.013},     # 30%
        {"kind": "verify", "verify_busy_s": 0.020, "predicted_busy_s": 0.025},   # 25%
        {"kind": "verify", "verify_busy_s": 0.020, "predicted_busy_s": 0.0},     # no prediction
        {"kind": "verify", "verify_busy_s": 0.0, "predicted_busy_s": 0.02},      # nothing measured
    ]
    errors = model_error(records)
    assert errors["model_error_draft"] == pytest.approx(0.2)
    assert errors["model_error_verify"] == pytest.approx(0.25)
    assert errors["model_predictions"] == 4
    none = model_error([{"kind": "draft", "draft_busy_s": 0.01, "predicted_busy_s": 0.0}])
    assert math.isnan(none["model_error_draft"]) and none["model_predictions"] == 0


def test_auto_choices_from_step_records():
    """Layout shares and draft lengths come from the verify calls (every layout has them)."""
    records = [
        {"kind": "draft", "start_s": 0.0, "layout": "sd", "draft_lengths": [4, 2]},
        {"kind": "verify", "start_s": 0.1, "layout": "sd", "draft_lengths": [4, 2]},
        {"kind": "verify", "start_s": 0.3, "layout": "ar", "draft_lengths": []},
        {"kind": "verify", "start_s": 0.2, "layout": "psd", "draft_lengths": [3]},
        {"kind": "verify", "start_s": 0.4, "layout": "ar", "draft_lengths": [0, 0], "borrowed": True},
    ]
    metrics = auto_metrics(records)
    assert metrics["layout_share"] == {"ar": 0.5, "sd": 0.25, "psd": 0.25}
    assert metrics["lent_share"] == 0.5                     # of the plain steps, one borrowed
    assert "lent_share" not in auto_metrics(records[:2])
    assert metrics["mean_draft_length"] == pytest.approx((4 + 2 + 3 + 0 + 0) / 5)
    assert metrics["max_draft_length"] == 4
    assert auto_metrics([{"kind": "verify", "start_s": 0.0, "verify_busy_s": 0.01}]) == {}   # older gateways


def test_a_runs_layout_changes_are_autos_decisions_since_the_run_began_that_changed_layout():
    history = [{"at_s": 9.0, "layout": "psd", "requests": 8},                 # the warm-up's
               {"at_s": 10.2, "layout": "ar", "requests": 8, "layout_tokens_per_s": {"ar": 800.04, "psd": 700.0}},
               {"at_s": 10.4, "layout": "ar", "requests": 8},                 # no change
               {"at_s": 11.0, "layout": "psd", "trying": "psd", "requests": 8},
               {"at_s": 11.5, "layout": "ar", "trying": "", "requests": 7}]
    info = {"plan": {"history": history}}
    calls = [{"kind": "verify", "start_s": 10.1}, {"kind": "verify", "start_s": 12.0}, {"kind": "free"}]
    assert newest_decision(info) == 11.5 and newest_decision({}) == float("-inf")
    assert layout_changes(info, 9.0, calls) == [
        {"at_s": 0.1, "layout": "ar", "trying": False, "requests": 8, "tokens_per_s": {"ar": 800.0, "psd": 700.0}},
        {"at_s": 0.9, "layout": "psd", "trying": True, "requests": 8, "tokens_per_s": {}},
        {"at_s": 1.4, "layout": "ar", "trying": False, "requests": 7, "tokens_per_s": {}}]
    assert layout_changes(info, 11.5, calls) == [] and layout_changes({}, 0.0, calls) == []


def test_plain_turns_client_values_into_json():
    """The client returns repeated fields and sub-messages as protobuf objects: stored as plain values."""
    from minedraft.client.types import message_to_dict
    from minedraft.v1 import generation_pb2

    record = message_to_dict(generation_pb2.StepRecord(kind="verify", layout="psd", draft_lengths=[3, 1]))
    info = message_to_dict(generation_pb2.ServerInfo(
        mode="auto", cost_model=generation_pb2.CostModel(verify_calls=5, median_error=0.1),
        plan=generation_pb2.AutoPlan(layout="sd", draft_lengths=[2], layout_tokens_per_s={"sd": 9.0})))
    record, info = plain(record), plain(info)
    assert record["draft_lengths"] == [3, 1]
    assert info["cost_model"]["verify_calls"] == 5 and info["plan"]["layout_tokens_per_s"] == {"sd": 9.0}
    assert json.loads(json.dumps([record, info])) == [record, info]


def test_rate_steps():
    assert parse_rate_steps("2:20, 8:20,2:20") == [Phase(2, 20), Phase(8, 20), Phase(2, 20)]
    for bad in ("2", "2:x", "0:5", "2:-1", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_rate_steps(bad)
    phases = [Phase(20, 10), Phase(100, 10), Phase(20, 10)]
    arrivals = poisson_arrivals(phases, seed=1)
    assert arrivals == poisson_arrivals(phases, seed=1) and arrivals == sorted(arrivals)
    counts = [sum(s <= t < s + 10 for t in arrivals) for s in (0, 10, 20)]
    assert 140 < counts[0] < 260 and 850 < counts[1] < 1150 and 140 < counts[2] < 260
    assert 0 < arrivals[0] and arrivals[-1] < 30


def test_phase_metrics_count_tokens_in_each_window():
    timings = [RequestTiming(0.5, 0.1, 1.5, 4, [], AcceptanceStats(), [0.6, 0.9, 1.2, 1.5]),
               RequestTiming(1.2, 0.2, 2.4, 3, [], AcceptanceStats(), [1.4, 2.1, 2.4]),
               RequestTiming(1.8, 0.1, 3.5, 2, [], AcceptanceStats(), [1.9, 3.5])]   # 3.5: the drain
    phases = phase_metrics(timings, [Phase(1, 1), Phase(4, 2)])
    assert [(p["rate"], p["start_s"], p["end_s"], p["requests"]) for p in phases] == [(1, 0, 1, 1), (4, 1, 3, 2)]
    assert phases[0]["output_tokens_per_s"] == 2 / 1 and phases[1]["output_tokens_per_s"] == 6 / 2
    assert phases[0]["latency_p50_s"] == pytest.approx(1.0)
    assert throughput_series(timings) == [2, 4, 2, 1]


def test_mixed_workload_alternates_code_and_prose():
    workload = load_workload("mixed", 64)
    assert workload.kinds[:4] == ["code", "prose", "code", "prose"]
    assert workload.kinds.count("code") == workload.kinds.count("prose") == 32
    assert len(set(workload.prompts)) == 64 and all(p.strip() for p in workload.prompts)
    prose = [p for p, kind in zip(workload.prompts, workload.kinds) if kind == "prose"]
    assert not any("def " in p or "self." in p for p in prose)
    assert load_workload("mixed", 130).kinds[64:66] == ["code", "prose"]     # repeated to fill
    assert set(load_workload(None, 3).kinds) == {""}
    timings = [RequestTiming(0, 0, 1, 5, [], AcceptanceStats(2, 8, 6)),      # code: 6 of 8 accepted
               RequestTiming(0, 0, 1, 5, [], AcceptanceStats(4, 8, 1)),      # prose: 1 of 8
               RequestTiming(0, 0, 1, 5, [], AcceptanceStats(2, 8, 4))]
    by_kind = acceptance_by_kind(timings, ["code", "prose", "code"])
    assert by_kind["code"]["acceptance_rate"] == pytest.approx(10 / 16) and by_kind["code"]["requests"] == 2
    assert by_kind["prose"]["mean_acceptance_length"] == pytest.approx(5 / 4)
    assert acceptance_by_kind(timings, ["", "", ""]) == {}
    assert acceptance_by_kind([RequestTiming(0, 0, 1, 5, [], AcceptanceStats())], ["code"]) == {}   # ar


def test_mixed_workload_is_greedy_code_and_sampled_prose():
    """Two kinds of clients: code completion greedy, prose sampled with a seed of its own, so its
    outputs are reproducible and (verification being coupled) equal ar's."""
    workload = load_workload("mixed", 64)
    rows = list(zip(workload.kinds, workload.sampling))
    assert len(rows) == 64 and all(sampling is None for kind, sampling in rows if kind == "code")
    prose = [sampling for kind, sampling in rows if kind == "prose"]
    assert len(prose) == 32 and all(sampling["temperature"] == 1.0 for sampling in prose)
    assert len({sampling["seed"] for sampling in prose}) == 32
    assert [sampling["seed"] for sampling in prose] == list(range(1, 64, 2))     # the row's index
    assert load_workload("mixed", 130).sampling[64:66] == workload.sampling[:2]   # repeated with its rows
    head = workload.head(3)          # an open loop's schedule: each prompt keeps its kind and sampling
    assert (head.prompts, head.kinds, head.sampling) == (workload.prompts[:3], workload.kinds[:3],
                                                         workload.sampling[:3])
    assert load_workload(None, 3).sampling == [None] * 3


def test_only_rows_that_ask_are_sampled(tmp_path):
    """Other sets are unaffected; a row's sampling keys of the wrong type are rejected at its line."""
    from minedraft.bench.workload import Workload

    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "a"}\n"b"\n{"turns": ["c"], "top_k": 5, "top_p": 0.9, "seed": 0}\nd\n')
    assert load_workload(str(rows), 4).sampling == [None, None, {"top_k": 5, "top_p": 0.9, "seed": 0}, None]
    for bad in ('"temperature": "hot"', '"seed": 1.5', '"seed": true'):
        rows.write_text('{"prompt": "a"}\n\n{"prompt": "b", ' + bad + '}\n')
        with pytest.raises(ValueError, match="rows.jsonl:3: "):
            load_workload(str(rows), 2)
    assert Workload(["p"], ["code"]).sampling == [None]
    with pytest.raises(ValueError, match="1 prompts but 1 kinds and 2 sampling"):
        Workload(["p"], ["code"], [None, None])


def test_driver_sends_each_prompt_its_own_sampling():
    """The run's length on every request, each row's sampling on top: prose sampled, code greedy."""
    import asyncio

    from minedraft.bench.driver import request_options, run_workload
    from minedraft.client.types import build_request

    workload = load_workload("mixed", 4)
    wire = [build_request(prompt, request_options(48, True, sampling)).sampling
            for prompt, sampling in zip(workload.prompts, workload.sampling)]
    assert [(w.max_tokens, w.ignore_eos) for w in wire] == [(48, True)] * 4
    assert [w.temperature for w in wire] == [0.0, 1.0, 0.0, 1.0]
    assert [w.HasField("seed") for w in wire] == [False, True, False, True]
    assert [wire[1].seed, wire[3].seed] == [1, 3]
    with pytest.raises(ValueError, match="2 prompts but 1 sampling"):      # before any connection
        asyncio.run(run_workload("localhost:1", ["a", "b"], 4, False, 1, None, "x", sampling=[None]))


def _row(mode: str, k: int, tps: float, **extra) -> dict:
    return {"mode": mode, "k": k, "concurrency": 8, "output_tokens_per_s": tps, "verifier_cpus": "0-1", **extra}


def test_headline_is_auto_against_the_best_fixed_setting():
    rows = [_row("auto", 6, 500.0), _row("ar", 0, 430.0), _row("ar-1core", 0, 470.0),
            _row("sd", 2, 420.0), _row("sd", 4, 440.0), _row("sd-colocated", 4, 460.0),
            _row("psd", 2, 410.0), _row("psd", 6, 480.0),
            _row("hf-generate", 0, 550.0), _row("hf-assisted", 0, 900.0)]
    top = headline(rows)
    assert top.subject["mode"] == "auto" and (top.best_fixed["mode"], top.best_fixed["k"]) == ("psd", 6)
    assert top.generate["mode"] == "hf-generate"          # batch-1 assisted generation is no baseline
    figures = top.figures()
    assert figures["best_fixed"] == "psd, k=6" and figures["over_best_fixed"] == pytest.approx(500 / 480)
    assert figures["over_generate"] == pytest.approx(500 / 550)
    assert top.gains() == [("the best fixed setting (psd, k=6)", "+4%"), ("transformers generate", "-9%")]
    # Without auto (runs from before it): psd against the best of the others.
    legacy = headline([r for r in rows if r["mode"] not in ("auto", "hf-generate")])
    assert legacy.subject["k"] == 6 and legacy.best_fixed["mode"] == "ar-1core" and legacy.generate is None
    assert headline([_row("ar", 0, 1.0)]) is None
    # Plain decoding on one core is a fixed setting too: when it is the fastest, auto must beat it.
    faster_alone = [r if r["mode"] != "ar-1core" else _row("ar-1core", 0, 520.0) for r in rows]
    assert headline(faster_alone).figures()["best_fixed"] == "ar-1core"


def test_older_runs_name_their_one_core_ar():
    report = {"runs": [{"mode": "ar", "k": 0}, {"mode": "ar", "k": 0, "verifier_cpus": "0-1"}, {"mode": "sd"}]}
    assert [r["mode"] for r in runs_of(report)] == ["ar-1core", "ar", "sd"]


def test_tables_show_auto_columns_and_the_headline():
    auto = _row("auto", 6, 500.0, layout_share={"psd": 0.7, "ar": 0.3}, mean_draft_length=2.5,
                model_error_draft=0.08, model_error_verify=float("nan"), model_predictions=10,
                over_best_fixed=500 / 480, same_as_ar=True)
    psd = _row("psd", 6, 480.0, same_as_ar=True)
    printed = terminal_table([auto, psd], 8).splitlines()
    assert printed[2].split() == ["mode", "k", "tok/s", "layout", "mean", "k", "model", "err", "/best", "==ar"]
    assert printed[3].split() == ["auto", "6", "500.0", "psd", "70%", "2.50", "8%/-", "1.04", "yes"]
    assert printed[-1] == "headline: auto: +4% against the best fixed setting (psd, k=6)"
    table = markdown_table([auto, psd])
    assert table[0] == "| mode | k | tok/s | layout | mean k | model err | /best |"
    assert table[3] == "| psd | 6 | 480.0 |  |  |  |  |"


def test_rounds_interleave_every_run():
    """Every spec once a round; round 1 with the modes spread, odd rounds backwards (over a
    pair of rounds every spec's mean position is the same), and each round starts with another spec."""
    specs = [RunSpec(mode, k, 8) for mode, k in [("auto", 6), ("ar", 0), ("sd", 2), ("psd", 2), ("psd", 4)]]
    for rounds in (2, 3, 4):
        orders = [round_order(specs, index, rounds) for index in range(rounds)]
        assert orders[0] == spread_modes(specs) and orders[1] == orders[0][::-1]
        assert all(sorted(order, key=specs.index) == specs for order in orders)
        assert all(a != b for a, b in itertools.pairwise(orders))
        assert len({order[0] for order in orders}) == rounds           # no spec always runs first
        for first, second in zip(orders[::2], orders[1::2]):
            assert {first.index(s) + second.index(s) for s in specs} == {len(specs) - 1}
    assert round_order(specs[:1], 1, 2) == specs[:1] and round_order([], 0, 3) == []
    assert apply_presets(bench_args("--rounds", "0"))


def test_a_rounds_runs_of_one_mode_are_spread_over_it():
    """A mode's settings never run one after another (they would share one spell of the
    machine's speed): each mode's j-th of n runs sits near (j + 1/2) / n of the round, and a
    mode of one run mid-round."""
    args = bench_args("--sweep", "--peers")
    assert apply_presets(args) is None
    specs = [spec for spec in run_list(args) if spec.concurrency == 8]
    order = spread_modes(specs)
    assert sorted(order, key=specs.index) == specs
    assert all(a.mode != b.mode for a, b in itertools.pairwise(order))
    for mode in {spec.mode for spec in specs}:
        positions = [i for i, spec in enumerate(order) if spec.mode == mode]
        runs = len(positions)
        assert [spec.k for spec in order if spec.mode == mode] == [s.k for s in specs if s.mode == mode]
        for j, position in enumerate(positions):
            assert abs((position + 0.5) / len(order) - (j + 0.5) / runs) <= 0.5 / runs
    assert [(s.mode, s.k) for s in order][:5] == [("psd", 2), ("sd", 2), ("sd-colocated", 2), ("psd", 4), ("auto", 8)]


def test_progress_names_the_round(capsys):
    Progress(4, 2).begin(RunSpec("psd", 4, 8), 1)
    Progress(2).begin(RunSpec("psd", 4, 8))
    assert capsys.readouterr().out.splitlines() == ["[1/4] round 2/2: psd k=4 C=8 | elapsed 0m00s, ETA -",
                                                    "[1/2] psd k=4 C=8 | elapsed 0m00s, ETA -"]


def test_rounds_fold_into_medians_and_spread():
    nan = float("nan")
    rounds = [_row("psd", 4, tps, latency_p99_s=p99, model_error_draft=error, same_as_ar=same, series=series,
                   acceptance_by_kind={"code": {"requests": 2, "mean_acceptance_length": mal}})
              for tps, p99, error, same, series, mal in [(100.0, 1.0, 0.1, True, [1, 2], 3.0),
                                                         (110.0, 1.4, nan, True, [1, 2, 3], 3.5),
                                                         (90.0, 1.2, 0.3, False, [2], 2.5)]]
    row = median_row(rounds)
    assert row["output_tokens_per_s"] == 100.0 and row["latency_p99_s"] == 1.2
    assert row["model_error_draft"] == pytest.approx(0.2)              # a round with none is left out
    assert row["acceptance_by_kind"] == {"code": {"requests": 2, "mean_acceptance_length": 3.0}}
    assert row["series"] == [1, 2]                                     # shapes differ: round 1's
    assert row["same_as_ar"] is False                                  # must hold in every round
    assert row["rounds"] == 3 and row["tokens_per_s_rounds"] == [100.0, 110.0, 90.0]
    assert row["tokens_per_s_spread"] == pytest.approx((110 - 90) / 100)
    two = median_row(rounds[:2])
    assert two["k"] == 4 and isinstance(two["k"], int) and two["output_tokens_per_s"] == 105.0
    assert "rounds" not in median_row(rounds[:1]) and median_row(rounds[:1]) == rounds[0]   # one round: as today
    runs = [{("ar", 0): {"row": _row("ar", 0, tps), "steps": [tps]}, ("psd", 4): {"row": r, "steps": [i]}}
            for i, (tps, r) in enumerate(zip((50.0, 60.0, 40.0), rounds))]
    runs[1] = dict(reversed(runs[1].items()))                          # round 2 ran backwards
    folded = fold_runs(runs)
    assert list(folded) == [("ar", 0), ("psd", 4)] and folded["ar", 0]["row"]["output_tokens_per_s"] == 50.0
    assert folded["psd", 4]["steps"] == [0]                            # round 1's step records
    runs[0] = dict(reversed(runs[0].items()))                          # round 1 ran psd first ...
    assert list(fold_runs(runs)) == [("psd", 4), ("ar", 0)]
    assert list(fold_runs(runs, [("ar", 0), ("psd", 4)])) == [("ar", 0), ("psd", 4)]     # ... listed as given


def test_each_run_shows_the_hosts_pace_against_the_others():
    """A run's pace (its probes' mean) over the median of its concurrency's runs, in the tables
    beside the throughput; rows without probes (older reports) have none, and rounds keep
    each round's pace."""
    rows = [_row("auto", 8, 100.0, pace=400.0), _row("psd", 4, 90.0, pace=500.0), _row("sd", 4, 80.0, pace=300.0),
            _row("hf-generate", 0, 120.0, peer_batch=8)]
    relative_paces(rows)
    assert [row.get("relative_pace") for row in rows] == [1.0, 1.25, 0.75, None]
    assert markdown_table(rows)[0].startswith("| mode | k | tok/s | pace |")
    assert "| psd | 4 | 90.0 | 1.25 |" in "\n".join(markdown_table(rows))
    assert "pace" not in markdown_table([_row("psd", 4, 90.0)])[0]
    assert median_row([_row("psd", 4, 90.0, pace=p) for p in (500.0, 300.0)])["pace_rounds"] == [500.0, 300.0]
    shares = [{"ar": 1.0}, {"ar": 0.6, "psd": 0.4}]          # each round's choices kept as they were
    auto = median_row([_row("auto", 8, 90.0, layout_share=s, lent_share=0.9 * i) for i, s in enumerate(shares)])
    assert auto["layout_share_rounds"] == shares and auto["lent_share_rounds"] == [0.0, 0.9]
    assert "layout_share_rounds" not in median_row([_row("psd", 4, 90.0) for _ in range(2)])
    relative_paces([_row("psd", 4, 90.0)])                             # none probed: nothing to do


def test_the_pace_probe_leaves_torchs_threads_as_it_found_them():
    import torch

    threads = torch.get_num_threads()
    assert probe(0.02) > 0
    assert torch.get_num_threads() == threads
    result, pace = probed(lambda: "measured", seconds=0.02)         # a run between two probes
    assert result == "measured" and pace["pace"] == (pace["pace_before"] + pace["pace_after"]) / 2 > 0


def _rounds_rows() -> list[dict]:
    """Three rounds of auto, two fixed settings and transformers' generate, folded: the best
    fixed setting by median is psd (95 tok/s), but sd was the faster in round 2."""
    measured = [(100.0, 95.0, 90.0, 80.0), (120.0, 110.0, 125.0, 100.0), (90.0, 92.0, 85.0, 100.0)]
    return fold_rows([[_row("auto", 6, auto, same_as_ar=True), _row("psd", 4, psd, same_as_ar=True),
                       _row("sd", 2, sd, same_as_ar=True),
                       _row("hf-generate", 0, generate, peer_batch=8, same_as_ar=True)]
                      for auto, psd, sd, generate in measured])


def test_headline_ratios_are_paired_by_round():
    rows = _rounds_rows()
    top = headline(rows)
    assert (top.subject["output_tokens_per_s"], top.best_fixed["mode"]) == (100.0, "psd")
    figures = top.figures()
    # Each round's auto against that round's best: 100/95, 120/125 (sd), 90/92. Their median,
    # 90/92, not the ratio of medians 100/95.
    assert figures["over_best_fixed_rounds"] == pytest.approx([100 / 95, 120 / 125, 90 / 92])
    assert figures["over_best_fixed"] == pytest.approx(90 / 92)
    assert figures["best_fixed"] == "psd, k=4" and figures["best_fixed_rounds"] == ["psd, k=4", "sd, k=2", "psd, k=4"]
    assert figures["over_generate_rounds"] == pytest.approx([1.25, 1.2, 0.9]) and figures["over_generate"] == 1.2
    # Held out: round 1 against the best on rounds 2 and 3 (sd, median 105 against psd's 101):
    # 100/90; round 2 against psd (93.5 against 87.5): 120/110; round 3 against sd: 90/85.
    assert figures["over_held_out_best_rounds"] == pytest.approx([100 / 90, 120 / 110, 90 / 85])
    assert figures["held_out_best_rounds"] == ["sd, k=2", "psd, k=4", "sd, k=2"]
    assert figures["over_held_out_best"] == pytest.approx(120 / 110)
    assert top.gains() == [("the best fixed setting of each round (psd, k=4 or sd, k=2)", "-2% (-4% to +5%, 3 rounds)"),
                           ("the best fixed setting of the other rounds (sd, k=2 or psd, k=4)",
                            "+9% (+6% to +11%, 3 rounds)"),
                           ("transformers generate", "+20% (-10% to +25%, 3 rounds)")]
    printed = terminal_table(rows, 8).splitlines()
    assert "medians of 3 interleaved rounds" in printed[1]
    assert printed[2].split()[:5] == ["mode", "k", "tok/s", "spread", "%"]
    assert printed[3].split()[:4] == ["auto", "6", "100.0", "30.0"]            # (120 - 90) / 100
    assert printed[-1] == ("headline: auto: -2% (-4% to +5%, 3 rounds) against the best fixed setting of each round "
                           "(psd, k=4 or sd, k=2), +9% (+6% to +11%, 3 rounds) against the best fixed setting of the "
                           "other rounds (sd, k=2 or psd, k=4), +20% (-10% to +25%, 3 rounds) against transformers "
                           "generate")


def test_docs_regions_quote_rounds():
    config = {**vars(bench_args("--rounds", "3")), "modes": ["auto", "psd", "sd"], "k": [2], "concurrency": [8],
              "out": "o"}
    report = {"config": config, "environment": {"cpus": 2}, "runs": _rounds_rows()}
    summary = readme_summary(report)
    assert "3 interleaved rounds" in summary and "--rounds 3" in summary
    assert "-2% (psd, k=4 or sd, k=2; -4% to +5%, 3 rounds) at concurrency 8" in " ".join(summary.split())
    tables = markdown_tables(report)
    assert "Figures: medians of 3 interleaved rounds; spread %: (max - min) / median of tok/s." in tables
    assert "| mode | k | tok/s | spread % |" in tables and "| auto | 6 | **100.0** | 30.0 |" in tables


def test_overview_table_is_the_sweep_in_one_table():
    """A row per concurrency: each fixed mode at its best k, and auto's ratios as the median of
    the rounds' own (not of the medians) with their range."""
    rows = _rounds_rows()
    for row in rows:
        row.update(latency_p50_s={"auto": 1.1, "psd": 1.0}.get(row["mode"], 2.0), mean_draft_length=2.64,
                   layout_share={"psd": 0.8, "ar": 0.2})
    report = {"config": {"rounds": 3}, "runs": rows + [{**r, "concurrency": 16} for r in rows if r["mode"] != "auto"]}
    text = overview_table(report)
    assert text.startswith("tok/s: medians of 3 interleaved rounds")
    lines = text[text.index("| C |"):].splitlines()
    assert lines[0].split(" | ")[3:6] == ["sd best", "psd best", "transformers generate"]
    # sd's median is 90, psd's 95; auto over each round's best: 100/95, 120/125, 90/92; over
    # the other rounds' best: 100/90, 120/110, 90/85; p50 1.1 against psd's 1.0.
    assert lines[2] == "| 8 | 100 | psd 80% | 90 (k=2) | 95 (k=4) | 100 | 0.98 (0.96-1.05) | 1.09 (1.06-1.11) | 1.10 | 2.6 |"
    assert len(lines) == 3                  # no auto at C = 16: no row
    assert overview_table({"runs": [r for r in rows if r["mode"] != "auto"]}) == ""


def test_num_prompts_default():
    args = bench_args()
    assert [num_prompts(c, args) for c in (1, 2, 4, 8, 16, 64)] == [16, 16, 16, 32, 64, 256]
    assert num_prompts(1, bench_args("--num-prompts", "4")) == 4
    assert len(workload_for(1, args).prompts) == 16 and len(workload_for(2, args, scale=2).prompts) == 32


def test_sweep_preset_run_list():
    args = bench_args("--sweep")
    assert apply_presets(args) is None
    specs = run_list(args)
    assert len(specs) == 7 * (1 + 1 + 3 + 3 + 4)
    assert [s.concurrency for s in specs[::12]] == [1, 2, 4, 8, 16, 32, 64]
    first = [(s.mode, s.k) for s in specs[:12]]
    assert first == [("auto", 8), ("ar", 0), ("sd", 2), ("sd", 4), ("sd", 6), ("sd-colocated", 2),
                     ("sd-colocated", 4), ("sd-colocated", 6), ("psd", 2), ("psd", 4), ("psd", 6), ("psd", 8)]
    with_peers = bench_args("--modes", "auto", "ar-1core", "--k", "2", "4", "--auto-k", "8", "--peers",
                            "--concurrency", "1", "64")
    assert apply_presets(with_peers) is None
    assert [(s.mode, s.k, s.concurrency) for s in run_list(with_peers)] == [
        ("auto", 8, 1), ("ar-1core", 0, 1), ("peers", 0, 1), ("auto", 8, 64), ("ar-1core", 0, 64), ("peers", 0, 64)]
    assert apply_presets(bench_args("--quick", "--sweep"))
    assert apply_presets(bench_args("--rate-steps", "1:1", "--request-rate", "2"))
    assert apply_presets(bench_args("--random-weights", "--peers"))
    assert apply_presets(bench_args("--rate-steps", "0.01:0.01"))      # a schedule that sends nothing
    assert progress_line(0, 84, 0.0, "auto k=6 C=1") == "[1/84] auto k=6 C=1 | elapsed 0m00s, ETA -"
    assert progress_line(2, 84, 100.0, "sd k=2 C=1") == "[3/84] sd k=2 C=1 | elapsed 1m40s, ETA 1h08m"


def test_serve_configs_give_every_mode_the_same_cores():
    args = bench_args("--all-cpus", "0-1")
    ar = serve_config("ar", 0, 8, args)
    assert (ar.mode, ar.target_cpus, ar.target_threads, ar.max_batch) == ("ar", "0-1", 2, 8)
    one_core = serve_config("ar-1core", 0, 8, args)
    assert one_core.mode == "ar" and one_core.target_threads == 1 and one_core.target_cpus != "0-1"
    auto = serve_config("auto", 6, 64, args)
    assert (auto.mode, auto.k, auto.max_batch) == ("auto", 6, 64)
    psd = serve_config("psd", 4, 64, args)
    assert (auto.target_cpus, auto.draft_cpus) == (psd.target_cpus, psd.draft_cpus) and psd.max_batch == 32
    assert serve_config("psd", 4, 1, args).max_batch == 1        # C = 1: one batch of 1


def test_the_bench_sizes_each_runs_kv_cache_for_its_requests_unless_told(tmp_path):
    """Room for C requests of the longest prompt (in the target's tokens), the output and a
    verify of k + 1, a quarter more: the memory-bound stand-in's target at C = 64 holds
    1.3 GiB, where the services' default of 4096 blocks held 5 (a --paired run starts
    every setting at once)."""
    from minedraft import bundled
    from minedraft.bench.workload import longest_prompt_tokens
    from gateway.tokenizer import TextTokenizer

    args = bench_args("--max-tokens", "32")
    longest = longest_prompt_tokens(None, bundled.TARGET)
    encode = TextTokenizer(bundled.TARGET).encode
    assert longest == max(len(encode(prompt)) for prompt in bundled.load_prompts())
    assert longest < max(len(prompt.encode()) for prompt in bundled.load_prompts())    # tokens, not bytes
    per_request = math.ceil((longest + 32 + 4 + 2) / 16)
    assert serve_config("psd", 4, 64, args).num_blocks == math.ceil(1.25 * 64 * per_request)
    assert serve_config("auto", 4, 32, args).num_blocks == math.ceil(1.25 * 32 * per_request)
    assert serve_config("ar", 0, 1, args).num_blocks == 256                 # never fewer
    assert serve_config("psd", 4, 64, bench_args("--num-blocks", "4096")).num_blocks == 4096
    assert apply_presets(bench_args("--num-blocks", "0")) == "--num-blocks must be at least 1, got 0"
    no_tokenizer = tmp_path / "model"
    no_tokenizer.mkdir()
    assert longest_prompt_tokens(None, str(no_tokenizer)) == max(len(p.encode()) for p in bundled.load_prompts())
    memory_bound = bench_args("--memory-bound", "--max-tokens", "32", "--out", str(tmp_path))
    assert apply_presets(memory_bound) is None
    blocks = serve_config("auto", 4, 64, memory_bound).num_blocks
    config = json.loads((Path(memory_bound.target) / "config.json").read_text())
    per_block = 16 * config["num_hidden_layers"] * 2 * config["num_key_value_heads"] * config["head_dim"] * 4
    assert 4096 * per_block == 5 * 2 ** 30 and blocks * per_block < 1.5 * 2 ** 30


def test_memory_bound_preset(tmp_path):
    from minedraft.config import ModelConfig

    args = bench_args("--memory-bound", "--out", str(tmp_path))
    assert apply_presets(args) is None
    assert args.random_weights and args.synthetic_acceptance == [0.7]
    target, draft = ModelConfig.from_dir(args.target), ModelConfig.from_dir(args.draft)
    assert (target.hidden_size, target.num_layers, target.num_heads, target.num_kv_heads, target.head_dim,
            target.intermediate_size) == (1024, 20, 16, 8, 64, 3072)
    assert target.vocab_size == draft.vocab_size == 4096 and target.tie_word_embeddings
    assert (draft.hidden_size, draft.num_layers, draft.intermediate_size) == (256, 2, 768)
    layer = target.hidden_size * (target.num_heads + 2 * target.num_kv_heads) * target.head_dim \
        + target.num_heads * target.head_dim * target.hidden_size + 3 * target.hidden_size * target.intermediate_size
    assert 250e6 < target.num_layers * layer + target.vocab_size * target.hidden_size < 260e6   # > L3
    assert (tmp_path / "memory_bound" / "target" / "tokenizer.json").exists()     # what the gateway reads
    chosen = bench_args("--memory-bound", "--synthetic-acceptance", "0.9", "--out", str(tmp_path / "b"))
    assert apply_presets(chosen) is None and chosen.synthetic_acceptance == [0.9]
    several = bench_args("--synthetic-acceptance", "0.9", "0.1", "--out", str(tmp_path / "c"))
    assert apply_presets(several) is None and several.synthetic_acceptance == [0.9, 0.1]
    outside = bench_args("--synthetic-acceptance", "0.9", "-0.1", "--out", str(tmp_path / "d"))
    assert "--synthetic-acceptance" in apply_presets(outside)


def test_reproduce_command_names_the_new_flags():
    config = {**vars(bench_args()), "modes": ["auto", "psd"], "k": [2], "concurrency": [8], "psd_k": [2, 8],
              "auto_k": 6, "rate_steps": "2:20,8:20", "dataset": "mixed", "rounds": 3, "out": "o"}
    assert reproduce_command(config) == ("minedraft bench --modes auto psd --k 2 --concurrency 8 --dataset mixed "
                                         "--psd-k 2 8 --auto-k 6 --rate-steps 2:20,8:20 --rounds 3 --out o")


def test_auto_tiny_run_with_mixed_prompts_and_a_stepping_rate(tmp_path):
    """The whole path for auto against a real gateway: per-kind acceptance, per-phase rates,
    the plan and cost model from server info, and the plot of its choices."""
    from minedraft.cli import main

    rc = main(["bench", "--modes", "auto", "--k", "2", "--concurrency", "2", "--rate-steps", "3:1,6:1",
               "--max-tokens", "8", "--dataset", "mixed", "--warmup-s", "0", "--out", str(tmp_path)])
    assert rc == 0
    report = json.loads((tmp_path / "bench.json").read_text())
    (row,) = report["runs"]
    assert row["mode"] == "auto" and report["config"]["rate_steps"] == "3:1,6:1"
    assert [p["rate"] for p in row["phases"]] == [3, 6]
    # Eight-token answers to long prompts are mostly prefill: auto may rightly not draft at all.
    by_kind = row.get("acceptance_by_kind", {})
    assert set(by_kind) <= {"code", "prose"} and (by_kind or not row["mean_draft_length"]) and row["plan"]["layout"]
    assert sum(row["layout_share"].values()) == pytest.approx(1.0)
    assert row["model_predictions"] > 0 and all(isinstance(r["draft_lengths"], list) for r in row["step_records"])
    # auto's decisions during the run, on the step records' clock, kept beside them
    decisions, starts = row["plan_history"], [r["start_s"] for r in row["step_records"]]
    assert decisions and "history" not in row["plan"]
    assert all(min(starts) - 1.0 <= d["at_s"] <= max(starts) + 1.0 and d["layout"] in d["layout_tokens_per_s"]
               for d in decisions)
    assert {"auto_k2_c2.png", "rate_steps_c2.png", "vs_concurrency.png"} <= {p.name for p in tmp_path.glob("*.png")}


def test_auto_may_draft_as_far_as_any_fixed_setting_it_is_compared_with():
    """auto's k_max defaults to the longest draft of the run's fixed settings, --psd-k included
    (a sweep once capped auto at k = 6 against psd at k = 8)."""
    from minedraft.bench.runs import mode_ks

    args = argparse.Namespace(k=[2, 4, 6], psd_k=[2, 4, 6, 8], auto_k=None)
    assert mode_ks("auto", args) == [8]
    assert mode_ks("psd", args) == [2, 4, 6, 8] and mode_ks("sd", args) == [2, 4, 6]
    assert mode_ks("auto", argparse.Namespace(k=[2, 4], psd_k=None, auto_k=None)) == [4]
    assert mode_ks("auto", argparse.Namespace(k=[2, 4], psd_k=[8], auto_k=3)) == [3]


def test_an_output_other_than_ars_is_located_for_a_near_tie_check_in_every_round():
    ar = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10]]
    runs = {("ar", 0): {"row": {}, "token_ids": ar},
            ("psd", 4): {"row": {}, "token_ids": [list(t) for t in ar]},
            ("auto", 8): {"row": {}, "token_ids": [[1, 2, 3, 4], [5, 6, 70, 80], [9]]}}
    compare(runs, 1, argparse.Namespace(synthetic_acceptance=None))
    assert runs[("psd", 4)]["row"]["same_as_ar"] is True and "differences" not in runs[("psd", 4)]["row"]
    auto = runs[("auto", 8)]["row"]
    assert auto["same_as_ar"] is False
    assert auto["differences"] == [{"prompt": 1, "token": 2, "ar": [7, 8], "got": [70, 80]},
                                   {"prompt": 2, "token": 1, "ar": [10], "got": []}]     # stopped early
    # Folded over rounds: the one round that differed is kept, with its number.
    folded = median_row([_row("auto", 8, 100.0, same_as_ar=True), _row("auto", 8, 90.0, **auto)])
    assert folded["same_as_ar"] is False
    assert [(d["round"], d["prompt"]) for d in folded["differences"]] == [(2, 1), (2, 2)]
