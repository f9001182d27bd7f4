"""Prometheus metrics of the gateway, defined once here (names follow vLLM's, under `minedraft_`).

Three kinds, by what feeds them, so that a step costs the Batch Manager a few microseconds:
  request events   counters and histograms, from ActiveRequest (first token, each batch of
                   tokens, finish) and admission;
  step records     once per call record (EngineCalls.record), into the process's Timeline,
                   whose definitions `minedraft bench` reads too (minedraft/timeline.py);
  scrape time      gauges read off the Batch Manager being watched (queues, KV, the pool,
                   the layout) and the Timeline's totals: nothing to keep in step on the hot path.
The start-up profile's calls (layout "profile") are not counted: no request made them.
docs/metrics.md describes every metric; tests/test_metrics.py keeps the two in step.

The HTTP front end serves `metrics_endpoint` at GET /metrics; gateway/http/server.py's
`serve_metrics` serves it on a port of its own (--metrics-port) for deployments without the
HTTP front end. Both must run on the gateway's event loop (async endpoints): the scrape reads
live state.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import (CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, Counter, Histogram,
                               disable_created_metrics, generate_latest)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import Response

from minedraft.constants import LAYOUTS
from minedraft.metrics import AcceptanceStats
from minedraft.timeline import Timeline

if TYPE_CHECKING:
    from gateway.batch_manager import BatchManager
    from gateway.request import ActiveRequest

PROFILE_LAYOUT = "profile"
# Seconds. A CPU step takes a few ms, a GPU step tens; a request seconds to minutes.
FIRST_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                       20.0, 40.0, 80.0, 160.0, 640.0)
TOKEN_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5,
                 5.0, 10.0)
REQUEST_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0)
TOKEN_COUNT_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)
DRAFT_LENGTH_BUCKETS = (0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16)

disable_created_metrics()       # no *_created series: half the exposition, nothing a dashboard reads


class GatewayMetrics:
    """Every metric of one gateway process; hooks are one call each from the code they watch."""

    def __init__(self, registry: CollectorRegistry) -> None:
        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, labels, registry=registry)

        def histogram(name: str, doc: str, buckets: tuple[float, ...], labels: tuple[str, ...] = ()) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=registry)

        # Requests.
        self.prompt_tokens = counter("minedraft_prompt_tokens",
                                     "Prompt tokens of requests that reached their first token")
        self.generation_tokens = counter("minedraft_generation_tokens", "Tokens generated (streamed to clients)")
        self.request_success = counter("minedraft_request_success", "Requests finished, by finish reason",
                                       ("finished_reason",))
        self.request_failure = counter("minedraft_request_failure", "Requests ended by an error, by gRPC status code",
                                       ("code",))
        self.request_prompt_tokens = histogram("minedraft_request_prompt_tokens", "Prompt tokens per finished request",
                                               TOKEN_COUNT_BUCKETS)
        self.request_generation_tokens = histogram("minedraft_request_generation_tokens",
                                                   "Generated tokens per finished request", TOKEN_COUNT_BUCKETS)
        self.queue_time = histogram("minedraft_request_queue_time_seconds",
                                    "Seconds from arrival to admission into a batch", FIRST_TOKEN_BUCKETS)
        self.time_to_first_token = histogram("minedraft_time_to_first_token_seconds",
                                             "Seconds from arrival to the first token", FIRST_TOKEN_BUCKETS)
        self.inter_token_latency = histogram("minedraft_inter_token_latency_seconds",
                                             "Seconds between a request's successive batches of tokens (one "
                                             "batch per verify step: its accepted drafts and one more)",
                                             TOKEN_BUCKETS)
        self.time_per_output_token = histogram("minedraft_request_time_per_output_token_seconds",
                                               "Per finished request: (latency - TTFT) / (generated tokens - 1)",
                                               TOKEN_BUCKETS)
        self.e2e_latency = histogram("minedraft_e2e_request_latency_seconds",
                                     "Seconds from arrival to the final event", REQUEST_BUCKETS)
        # Speculation, from the verified results the requests kept.
        self.num_drafts = counter("minedraft_spec_decode_num_drafts", "Request-steps that drafted at least one token")
        self.num_draft_tokens = counter("minedraft_spec_decode_num_draft_tokens", "Draft tokens verified")
        self.num_accepted_tokens = counter("minedraft_spec_decode_num_accepted_tokens", "Draft tokens accepted")
        self.draft_tokens_per_pos = counter("minedraft_spec_decode_num_draft_tokens_per_pos",
                                            "Request-steps that drafted position `position` (0-based)", ("position",))
        self.accepted_tokens_per_pos = counter("minedraft_spec_decode_num_accepted_tokens_per_pos",
                                               "Request-steps whose draft at `position` (0-based) was accepted",
                                               ("position",))
        # Steps, from the call records.
        self.steps = counter("minedraft_steps", "Verify steps, by the layout they ran in", ("layout",))
        self.draft_length = histogram("minedraft_draft_length", "Draft length of each request of each verify step "
                                      "(0: not drafted)", DRAFT_LENGTH_BUCKETS)
        self.call_duration = histogram("minedraft_call_duration_seconds", "Seconds from sending a call to a "
                                       "service to its answer, queueing included", TOKEN_BUCKETS, ("kind",))
        self.acceptance = AcceptanceStats()     # the mean acceptance length, as minedraft.metrics defines it
        self.timeline = Timeline()
        self.manager: BatchManager | None = None
        registry.register(_ScrapeTime(self))

    def watch(self, manager: BatchManager) -> None:
        """The Batch Manager whose queues, KV ledger, pool and layout the scrape reads."""
        self.manager = manager

    # ---- request events ------------------------------------------------------------------------
    def request_admitted(self, req: ActiveRequest) -> None:
        self.queue_time.observe(time.monotonic() - req.arrival_s)

    def tokens_emitted(self, req: ActiveRequest, num_tokens: int) -> None:
        now = time.monotonic()
        if req.first_token_s is None:
            req.first_token_s = now
            self.prompt_tokens.inc(len(req.seq.prompt_token_ids))
            self.time_to_first_token.observe(now - req.arrival_s)
        else:
            self.inter_token_latency.observe(now - req.last_token_s)
        req.last_token_s = now
        self.generation_tokens.inc(num_tokens)

    def request_finished(self, req: ActiveRequest) -> None:
        latency = time.monotonic() - req.arrival_s
        generated = len(req.seq.output_token_ids)
        self.request_success.labels(req.seq.finish_reason.value).inc()
        self.e2e_latency.observe(latency)
        self.request_prompt_tokens.observe(len(req.seq.prompt_token_ids))
        self.request_generation_tokens.observe(generated)
        if req.first_token_s is not None and generated > 1:
            self.time_per_output_token.observe((req.last_token_s - req.first_token_s) / (generated - 1))

    def request_failed(self, code_name: str) -> None:
        self.request_failure.labels(code_name).inc()

    # ---- steps ---------------------------------------------------------------------------------
    def step_accepted(self, step: AcceptanceStats) -> None:
        """One verify step's drafted / accepted counts over its requests (minedraft.metrics)."""
        if not step.num_steps:
            return
        self.acceptance.merge(step)
        self.num_drafts.inc(step.num_steps)
        self.num_draft_tokens.inc(step.num_drafted)
        self.num_accepted_tokens.inc(step.num_accepted)
        for position, (drafted, accepted) in enumerate(zip(step.drafted_at, step.accepted_at)):
            self.draft_tokens_per_pos.labels(str(position)).inc(drafted)
            self.accepted_tokens_per_pos.labels(str(position)).inc(accepted)

    def call_recorded(self, call: dict[str, Any]) -> None:
        """One call record (StepRecord's fields as a dict), as EngineCalls.record makes it."""
        layout = call.get("layout", "")
        if layout == PROFILE_LAYOUT:
            return
        self.timeline.add(call)
        self.call_duration.labels(call["kind"]).observe(call["wall_s"])
        if call["kind"] == "verify":
            self.steps.labels(layout or "unknown").inc()
            for k in call.get("draft_lengths", ()):
                self.draft_length.observe(k)


class _ScrapeTime(Collector):
    """The gauges read when scraped, and the Timeline's totals as counters."""

    def __init__(self, metrics: GatewayMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        manager, timeline = self.metrics.manager, self.metrics.timeline
        running = GaugeMetricFamily("minedraft_num_requests_running", "Requests admitted into a batch")
        waiting = GaugeMetricFamily("minedraft_num_requests_waiting", "Requests queued for admission")
        kv_usage = GaugeMetricFamily("minedraft_kv_cache_usage_perc",
                                     "Share of the verifier's KV blocks reserved by admission (0..1)")
        pool_size = GaugeMetricFamily("minedraft_drafter_pool_size", "Drafters in the pool")
        drafter_requests = GaugeMetricFamily("minedraft_drafter_requests",
                                             "Requests whose draft KV lives on the drafter", labels=("drafter",))
        drafter_kv = GaugeMetricFamily("minedraft_drafter_kv_cache_usage_perc",
                                       "Share of the drafter's KV blocks reserved by admission (0..1)",
                                       labels=("drafter",))
        drafter_busy = CounterMetricFamily("minedraft_drafter_compute_seconds",
                                           "The drafter's own compute seconds in draft calls, since it joined",
                                           labels=("drafter",))
        layout = GaugeMetricFamily("minedraft_layout", "1 for the layout the Batch Manager runs now (auto mode's "
                                   "choice, else the mode)", labels=("layout",))
        if manager is not None:
            admission = manager.admission
            waiting_now = len(admission.waiting)
            running.add_metric([], len(manager.requests) - waiting_now)
            waiting.add_metric([], waiting_now)
            kv_usage.add_metric([], admission.reserved_blocks / admission.kv_blocks if admission.kv_blocks else 0.0)
            drafters = list(manager.pool.drafters.values()) if manager.pool is not None else []
            pool_size.add_metric([], len(drafters))
            for drafter in drafters:
                drafter_requests.add_metric([drafter.address], len(drafter.request_ids))
                drafter_kv.add_metric([drafter.address], drafter.reserved_blocks / drafter.num_blocks
                                      if drafter.num_blocks else 0.0)
                drafter_busy.add_metric([drafter.address], drafter.compute_s)
            current = manager.layout
            for name in LAYOUTS:
                layout.add_metric([name], float(name == current))
        yield from (running, waiting, kv_usage, pool_size, drafter_requests, drafter_kv, drafter_busy, layout)
        acceptance = self.metrics.acceptance
        yield GaugeMetricFamily("minedraft_spec_decode_mean_acceptance_length",
                                "Tokens a drafting request-step emits on average, the bonus token included: "
                                "(accepted + drafts) / drafts; 1 before any draft, as plain decoding",
                                value=acceptance.mean_acceptance_length if acceptance.num_steps else 1.0)
        totals = (("drafter_busy", timeline.drafter_busy_s, "Drafter compute seconds (a step's slowest drafter)"),
                  ("verifier_busy", timeline.verifier_busy_s, "Verifier compute seconds"),
                  ("data_plane", timeline.data_plane_s, "Seconds the verifier took drafts off the data plane"),
                  ("overlap", timeline.overlap_s, "Seconds the drafter and the verifier computed at once"),
                  ("services_busy", timeline.any_service_busy_s,
                   "Seconds in which the drafter or the verifier worked (data plane included)"),
                  ("active", timeline.span_s, "Seconds with calls in flight, gaps under a second counted in"))
        for name, value, doc in totals:
            yield CounterMetricFamily(f"minedraft_{name}_seconds", doc, value=value)
        yield CounterMetricFamily("minedraft_data_plane_bytes", "Draft bytes sent on the data plane",
                                  value=timeline.data_plane_bytes)
        shares = timeline.shares()
        for name in ("drafter_idle_share", "verifier_idle_share", "data_plane_share", "overlap_share",
                     "gateway_share"):
            yield GaugeMetricFamily(f"minedraft_{name}", f"{name.replace('_', ' ')} of the active span since "
                                    "start, as `minedraft bench` reports a run (minedraft/timeline.py)",
                                    value=shares[name])      # NaN before the first call


METRICS = GatewayMetrics(REGISTRY)      # the process's; hooks and exposition() use it


def exposition() -> tuple[bytes, str]:
    """The current metrics in the Prometheus text format, and its content type."""
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST


async def metrics_endpoint(request: Request) -> Response:
    body, content_type = exposition()
    return Response(body, media_type=content_type)
