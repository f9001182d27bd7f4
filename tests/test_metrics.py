"""The gateway's Prometheus metrics and logs: the shared time-share definitions on hand-built
call records (and the bench reading the same figures), the acceptance figures as
minedraft.metrics defines them, docs/metrics.md against the registry, the JSON log format and
the finished-request line, and a real cluster whose /metrics must agree with what its
clients received."""

from __future__ import annotations

import json
import logging
import math
import re
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway.metrics import GatewayMetrics
from minedraft.bench.report import plain, step_metrics
from minedraft.metrics import AcceptanceStats
from minedraft.timeline import IDLE_GAP_S, IntervalUnion, Timeline

DOC = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"

# sd: a draft, then its verify; psd: a verify (queued early, so its call is long) with a draft
# of the other batch inside its compute. Busy: drafter [0.002, 0.012], verifier [0.015, 0.035],
# verifier [0.040, 0.055] (1 ms of it the data plane), drafter [0.042, 0.050].
SD = [{"kind": "draft", "start_s": 0.000, "wall_s": 0.012, "draft_busy_s": 0.010, "draft_batch": 8},
      {"kind": "verify", "start_s": 0.013, "wall_s": 0.022, "verify_busy_s": 0.020, "verify_batch": 8,
       "layout": "sd", "draft_lengths": [3] * 8}]
PSD = [{"kind": "verify", "start_s": 0.035, "wall_s": 0.020, "verify_busy_s": 0.014, "data_plane_s": 0.001,
        "data_plane_bytes": 4096, "verify_batch": 4, "layout": "psd", "draft_lengths": [4, 4, 2, 0]},
       {"kind": "draft", "start_s": 0.041, "wall_s": 0.009, "draft_busy_s": 0.008, "draft_batch": 4}]


def _samples(text: str) -> dict[tuple[str, frozenset], float]:
    """(sample name, labels) -> value of an exposition."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def _total(samples: dict, name: str) -> float:
    """The sum over every label set (and 0 when none)."""
    return sum(value for (sample, _), value in samples.items() if sample == name)


# ---- the shared definitions ---------------------------------------------------------------

def test_interval_union_merges_bridges_and_takes_any_order():
    union = IntervalUnion()
    assert union.add(0.0, 1.0) == 1.0
    assert union.add(2.0, 3.0) == 1.0
    assert union.add(0.5, 2.5) == pytest.approx(1.0)        # fills the gap between the two
    assert union.add(-1.0, -0.5) == 0.5                      # before everything
    assert union.length == pytest.approx(3.5)
    bridged = IntervalUnion()
    bridged.add(0.0, 1.0, bridge_s=0.5)
    assert bridged.add(1.4, 2.0, bridge_s=0.5) == pytest.approx(1.0)   # the 0.4 s gap counted in
    assert bridged.add(5.0, 6.0, bridge_s=0.5) == 1.0                   # a long gap is not
    assert bridged.length == pytest.approx(3.0)


def test_timeline_shares_on_hand_built_records():
    timeline = Timeline.of(SD + PSD)
    span = 0.055
    assert timeline.span_s == pytest.approx(span)
    shares = timeline.shares()
    assert shares["drafter_busy_share"] == pytest.approx(0.018 / span)
    assert shares["verifier_idle_share"] == pytest.approx(1 - 0.034 / span)
    assert shares["data_plane_share"] == pytest.approx(0.001 / span)
    assert timeline.overlap_s == pytest.approx(0.008)          # the psd draft inside the verify's compute
    assert shares["overlap_share"] == pytest.approx(0.008 / span)
    assert shares["gateway_share"] == pytest.approx((span - (0.010 + 0.020 + 0.015)) / span)
    assert timeline.data_plane_bytes == 4096
    assert all(math.isnan(v) for v in Timeline().shares().values())


def test_idle_time_between_calls_is_not_the_gateways():
    """A gap longer than IDLE_GAP_S with no call in flight is the server idle: it counts in
    neither the span nor the gateway share."""
    later = [{**call, "start_s": call["start_s"] + 5 * IDLE_GAP_S} for call in SD]
    timeline = Timeline.of(SD + later)
    assert timeline.span_s == pytest.approx(2 * 0.035)
    assert timeline.gateway_s == pytest.approx(2 * (0.035 - 0.030))


def test_live_metrics_and_the_bench_read_the_same_figures():
    """Records fed one at a time, as the gateway makes them (in the order their answers
    come), give the bench's figures for the same records; the start-up profile's are skipped."""
    metrics = GatewayMetrics(registry := CollectorRegistry())
    profile = {"kind": "verify", "start_s": -1.0, "wall_s": 0.5, "verify_busy_s": 0.4, "layout": "profile",
               "draft_lengths": [4]}
    records = SD + PSD
    for record in [profile, *sorted(records, key=lambda c: c["start_s"] + c["wall_s"])]:
        metrics.call_recorded(record)
    samples = _samples(generate_latest(registry).decode())
    bench = step_metrics(records)
    for share in ("drafter_idle_share", "verifier_idle_share", "data_plane_share", "overlap_share",
                  "gateway_share"):
        assert _value(samples, f"minedraft_{share}") == pytest.approx(bench[share]), share
    active = _value(samples, "minedraft_active_seconds_total")
    assert active == pytest.approx(bench["step_wall_mean_ms"] * bench["steps"] / 1e3)
    services_busy = _value(samples, "minedraft_services_busy_seconds_total")
    assert 1 - services_busy / active == pytest.approx(bench["gateway_share"])
    assert _value(samples, "minedraft_drafter_busy_seconds_total") == pytest.approx(0.018)
    assert _value(samples, "minedraft_verifier_busy_seconds_total") == pytest.approx(0.034)
    assert _value(samples, "minedraft_overlap_seconds_total") == pytest.approx(0.008)
    assert _value(samples, "minedraft_data_plane_bytes_total") == 4096
    assert _value(samples, "minedraft_steps_total", layout="sd") == 1
    assert _value(samples, "minedraft_steps_total", layout="psd") == 1
    assert _total(samples, "minedraft_steps_total") == 2                # not the profile's
    assert _value(samples, "minedraft_draft_length_count") == 12
    assert _value(samples, "minedraft_draft_length_sum") == 3 * 8 + 10
    assert _value(samples, "minedraft_call_duration_seconds_count", kind="draft") == 2


def test_acceptance_counters_follow_minedraft_metrics():
    metrics = GatewayMetrics(registry := CollectorRegistry())
    assert _value(_samples(generate_latest(registry).decode()), "minedraft_spec_decode_mean_acceptance_length") == 1.0
    expected = AcceptanceStats()
    for step in ([(4, 4), (4, 1), (2, 0)], [(3, 2)]):
        counts = AcceptanceStats()
        for drafted, accepted in step:
            counts.record(drafted, accepted)
            expected.record(drafted, accepted)
        metrics.step_accepted(counts)
    metrics.step_accepted(AcceptanceStats())                       # a step that drafted nothing
    samples = _samples(generate_latest(registry).decode())
    assert _value(samples, "minedraft_spec_decode_num_drafts_total") == expected.num_steps == 4
    assert _value(samples, "minedraft_spec_decode_num_draft_tokens_total") == expected.num_drafted == 13
    assert _value(samples, "minedraft_spec_decode_num_accepted_tokens_total") == expected.num_accepted == 7
    for position, (drafted, accepted) in enumerate(zip(expected.drafted_at, expected.accepted_at)):
        assert _value(samples, "minedraft_spec_decode_num_draft_tokens_per_pos_total",
                      position=str(position)) == drafted
        assert _value(samples, "minedraft_spec_decode_num_accepted_tokens_per_pos_total",
                      position=str(position)) == accepted
    assert _value(samples, "minedraft_spec_decode_mean_acceptance_length") == pytest.approx(
        expected.mean_acceptance_length) == (7 + 4) / 4        # the bonus token included


# ---- the docs ----------------------------------------------------------------------------

def test_docs_list_every_metric_and_no_other():
    """docs/metrics.md's table names each metric the gateway exports, with its type."""
    registry = CollectorRegistry()
    GatewayMetrics(registry)
    defined = {family.name + ("_total" if family.type == "counter" else ""): family.type
               for family in registry.collect()}
    documented = {name: kind for name, kind in re.findall(r"^\| `(minedraft_\w+)` \| (\w+) \|", DOC.read_text(),
                                                          re.MULTILINE)}
    assert set(documented) == set(defined), (set(defined) - set(documented), set(documented) - set(defined))
    assert documented == defined


# ---- logs --------------------------------------------------------------------------------

def test_json_log_lines_carry_the_finished_request_fields(caplog):
    from gateway.request import ActiveRequest
    from gateway.tokenizer import TextTokenizer
    from minedraft import bundled
    from minedraft.detokenizer import IncrementalDetokenizer, StopStringMatcher
    from minedraft.sampling_params import SamplingParams
    from minedraft.sequence import FinishReason, Sequence
    from minedraft.service.runtime import JsonFormatter

    tokenizer = TextTokenizer(bundled.TARGET)
    prompt = tokenizer.encode("def add(a, b):")
    seq = Sequence("req-7", prompt, SamplingParams(max_tokens=8), seed=1)
    req = ActiveRequest(seq, IncrementalDetokenizer(tokenizer, prompt), StopStringMatcher(()))
    seq.stats.record(3, 2)
    req.emit_tokens(seq.append([11, 12, 13]))
    with caplog.at_level(logging.INFO, logger="minedraft.gateway"):
        req.emit_final(FinishReason.LENGTH)
    [record] = [r for r in caplog.records if r.name == "minedraft.gateway"]
    assert "req-7" in record.getMessage() and "length" in record.getMessage()
    line = json.loads(JsonFormatter().format(record))
    assert line["level"] == "INFO" and line["logger"] == "minedraft.gateway" and line["message"] == record.getMessage()
    assert line["request_id"] == "req-7" and line["finish_reason"] == "length"
    assert (line["prompt_tokens"], line["generated_tokens"]) == (len(prompt), 3)
    assert line["mean_acceptance_length"] == 3.0 and line["acceptance_rate"] == pytest.approx(0.667)
    assert line["ttft_s"] >= 0 and line["total_s"] >= line["ttft_s"]
    assert line["time"].endswith("+00:00")


# ---- a real cluster ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def served():
    """A psd cluster with --metrics-port, driven by greedy and sampled requests, some at once
    (more than the batches hold, so some wait), one streamed; -> (responses, streamed
    chunks, step records, the /metrics exposition)."""
    from cluster_helpers import generate_all, request, stub
    from minedraft.client import Client
    from minedraft.launcher import Cluster, ServeConfig
    from minedraft.service.network import free_port

    config = ServeConfig(mode="psd", k=3, max_batch=2, port=0, metrics_port=free_port())
    prompts = ["def fibonacci(n):", "import numpy as np", "class Stack:", "The capital of France is",
               "for i in range(10):", "SELECT name FROM"]
    requests = [request(p, **({"temperature": 0.8, "seed": i} if i % 2 else {})) for i, p in enumerate(prompts)]
    with Cluster(config) as cluster:
        responses = generate_all(cluster, requests, concurrency=6)
        chunks = list(stub(cluster).GenerateStream(request("while True:", max_tokens=12), timeout=300))
        with Client(cluster.address, timeout=60) as client:
            steps = plain(client.step_stats())
        with urllib.request.urlopen(cluster.metrics_url, timeout=30) as answer:
            exposition = answer.read().decode()
    return responses, chunks, steps, exposition


def test_request_counters_match_what_clients_received(served):
    responses, chunks, _, exposition = served
    samples = _samples(exposition)
    finals = [c for c in chunks if c.finish_reason]
    generated = sum(len(r.token_ids) for r in responses) + sum(len(c.token_ids) for c in chunks)
    prompt_tokens = sum(r.prompt_tokens for r in responses) + finals[0].prompt_tokens
    count = len(responses) + 1
    assert _value(samples, "minedraft_generation_tokens_total") == generated
    assert _value(samples, "minedraft_prompt_tokens_total") == prompt_tokens
    assert _value(samples, "minedraft_request_success_total", finished_reason="length") == count
    assert _total(samples, "minedraft_request_success_total") == count
    assert _total(samples, "minedraft_request_failure_total") == 0
    for histogram in ("minedraft_time_to_first_token_seconds", "minedraft_e2e_request_latency_seconds",
                      "minedraft_request_queue_time_seconds", "minedraft_request_generation_tokens",
                      "minedraft_request_time_per_output_token_seconds"):
        assert _value(samples, f"{histogram}_count") == count, histogram
    assert _value(samples, "minedraft_request_generation_tokens_sum") == generated
    # Every token batch after a request's first is one inter-token interval.
    assert 0 < _value(samples, "minedraft_inter_token_latency_seconds_count") <= generated - count
    assert _value(samples, "minedraft_num_requests_running") == _value(samples, "minedraft_num_requests_waiting") == 0


def test_speculation_counters_match_the_responses_stats(served):
    responses, chunks, _, exposition = served
    samples = _samples(exposition)
    stats = [r.stats for r in responses] + [c.stats for c in chunks if c.finish_reason]
    total = AcceptanceStats()
    for s in stats:
        total.merge(AcceptanceStats(s.num_steps, s.num_drafted, s.num_accepted, list(s.drafted_at),
                                    list(s.accepted_at)))
    assert total.num_drafted > 0
    assert _value(samples, "minedraft_spec_decode_num_drafts_total") == total.num_steps
    assert _value(samples, "minedraft_spec_decode_num_draft_tokens_total") == total.num_drafted
    assert _value(samples, "minedraft_spec_decode_num_accepted_tokens_total") == total.num_accepted
    for position, drafted in enumerate(total.drafted_at):
        assert _value(samples, "minedraft_spec_decode_num_draft_tokens_per_pos_total",
                      position=str(position)) == drafted
        assert _value(samples, "minedraft_spec_decode_num_accepted_tokens_per_pos_total",
                      position=str(position)) == total.accepted_at[position]
    assert _value(samples, "minedraft_spec_decode_mean_acceptance_length") == pytest.approx(
        total.mean_acceptance_length)


def test_step_metrics_match_the_step_records(served):
    """The live Timeline over the run equals the bench's figures from GetStepStats' records."""
    _, _, steps, exposition = served
    samples = _samples(exposition)
    verifies = [s for s in steps if s["kind"] == "verify"]
    assert _total(samples, "minedraft_steps_total") == len(verifies)
    assert set(s["layout"] for s in verifies) >= {"psd"}
    for layout in ("sd", "psd"):
        assert _value(samples, "minedraft_steps_total", layout=layout) == sum(s["layout"] == layout for s in verifies)
    assert _value(samples, "minedraft_drafter_busy_seconds_total") == pytest.approx(
        sum(s["draft_busy_s"] for s in steps))
    assert _value(samples, "minedraft_data_plane_bytes_total") == sum(s["data_plane_bytes"] for s in steps)
    assert _value(samples, "minedraft_draft_length_count") == sum(len(s["draft_lengths"]) for s in verifies)
    bench = step_metrics(steps)
    for share in ("drafter_idle_share", "verifier_idle_share", "data_plane_share", "overlap_share",
                  "gateway_share"):
        assert _value(samples, f"minedraft_{share}") == pytest.approx(bench[share], abs=1e-9), share
    assert _value(samples, "minedraft_overlap_seconds_total") > 0           # psd overlaps


def test_pool_and_layout_gauges(served):
    _, _, _, exposition = served
    samples = _samples(exposition)
    assert _value(samples, "minedraft_drafter_pool_size") == 1
    [drafter] = [dict(labels)["drafter"] for name, labels in samples if name == "minedraft_drafter_requests"]
    assert _value(samples, "minedraft_drafter_requests", drafter=drafter) == 0
    assert _value(samples, "minedraft_drafter_compute_seconds_total", drafter=drafter) == pytest.approx(
        _value(samples, "minedraft_drafter_busy_seconds_total"))          # one drafter: its time is the pool's
    assert _value(samples, "minedraft_layout", layout="psd") == 1
    assert _value(samples, "minedraft_layout", layout="ar") == _value(samples, "minedraft_layout", layout="sd") == 0
    assert _value(samples, "minedraft_kv_cache_usage_perc") == 0
