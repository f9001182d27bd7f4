"""Early verify: a step's verify goes out with its draft call and waits at the verifier for
the drafts, so a step costs one gateway round trip, not two. In-process, with fake services
that behave as the real ones do: the verifier waits for each source's drafts (delivered by
the drafter on the data plane) or for the gateway to abandon them."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from gateway_helpers import ClosableChannel, active_request, streamed_tokens

from gateway.batch_manager import BatchManager, BatchManagerConfig
from gateway.engine_calls import MIN_WAIT_S, Deadlines
from gateway.pool import DrafterHandle, DrafterPool
from gateway.request import ActiveRequest
from minedraft.v1 import engine_pb2

TOKEN = 7
DRAFT_WAIT_S = 3.0      # the fake verifier's own limit on waiting for drafts: a test failing on it fails


class DataPlane:
    """What the drafters put on the data plane and what the gateway abandoned, per
    (drafter id, step id); and the order things happened in."""

    def __init__(self) -> None:
        self.settled: dict[tuple[str, int], asyncio.Event] = {}
        self.abandoned: set[tuple[str, int]] = set()
        self.log: list[tuple[str, int]] = []

    def slot(self, key: tuple[str, int]) -> asyncio.Event:
        return self.settled.setdefault(key, asyncio.Event())


class WaitingVerifier:
    """Verifies every item as accepting all its drafts (one TOKEN each, plus one), once each
    source's drafts arrived; a source abandoned verifies with k = 0."""

    def __init__(self, plane: DataPlane) -> None:
        self.plane = plane
        self.steps: list[engine_pb2.VerifyStepRequest] = []
        self.abandoning = self.most_abandoning = 0      # AbandonDrafts calls in flight at once

    async def Step(self, request, timeout=None):
        self.plane.log.append(("verify sent", request.step_id))
        self.steps.append(request)
        arrived = []
        for source in request.sources:
            key = (source.drafter_id, source.draft_step_id)
            await asyncio.wait_for(self.plane.slot(key).wait(), DRAFT_WAIT_S)
            arrived.append(key not in self.plane.abandoned)
        results = []
        for item in request.items:
            k = item.num_draft if item.num_draft and arrived[item.source] else 0
            results.append(engine_pb2.VerifyResult(request_id=item.request_id, token_ids=[TOKEN] * (k + 1),
                                                   num_draft=k))
        return engine_pb2.VerifyStepResponse(step_id=request.step_id, results=results, busy_s=0.001)

    async def AbandonDrafts(self, request, timeout=None):
        assert timeout is not None and timeout > 0
        key = (request.drafter_id, request.draft_step_id)
        self.abandoning += 1
        self.most_abandoning = max(self.most_abandoning, self.abandoning)
        await asyncio.sleep(0.01)
        self.abandoning -= 1
        self.plane.log.append(("abandoned", request.draft_step_id))
        self.plane.abandoned.add(key)
        self.plane.slot(key).set()
        return engine_pb2.AbandonDraftsResponse()


class FakeDrafter:
    """Drafts after a moment and puts the drafts on the data plane; the calls whose number is
    in `failing` fail with `code` instead (nothing reaches the data plane)."""

    def __init__(self, plane: DataPlane, drafter_id: str, failing: tuple[int, ...] = (),
                 code: grpc.StatusCode = grpc.StatusCode.NOT_FOUND) -> None:
        self.plane, self.drafter_id, self.failing, self.code = plane, drafter_id, failing, code
        self.calls = 0
        self.catch_ups: list[engine_pb2.DraftStepRequest] = []     # calls that only take tokens in ...
        self.catch_up_s, self.failing_catch_ups = 0.02, 0           # ... how long they take, how many fail
        self.drafts: list[engine_pb2.DraftStepRequest] = []        # calls that draft

    async def Step(self, request, timeout=None):
        if not request.items:                   # a free, no drafting
            return engine_pb2.DraftStepResponse(step_id=request.step_id)
        if request.catch_up:                    # takes tokens in, sends nothing
            self.catch_ups.append(request)
            self.plane.log.append(("catch-up sent", request.step_id))
            await asyncio.sleep(self.catch_up_s)
            if len(self.catch_ups) <= self.failing_catch_ups:
                raise grpc.aio.AioRpcError(grpc.StatusCode.NOT_FOUND, grpc.aio.Metadata(), grpc.aio.Metadata(),
                                           f"catch-up {len(self.catch_ups)} failed")
            self.plane.log.append(("caught up", request.step_id))
            return engine_pb2.DraftStepResponse(step_id=request.step_id, busy_s=self.catch_up_s)
        self.drafts.append(request)
        self.calls += 1
        await asyncio.sleep(0.02)
        if self.calls in self.failing:
            raise grpc.aio.AioRpcError(self.code, grpc.aio.Metadata(), grpc.aio.Metadata(),
                                       f"draft call {self.calls} failed")
        self.plane.log.append(("drafted", request.step_id))
        self.plane.slot((self.drafter_id, request.step_id)).set()
        return engine_pb2.DraftStepResponse(step_id=request.step_id, busy_s=0.02)


async def _serve(mode: str, drafters: FakeDrafter | list[FakeDrafter], plane: DataPlane, requests: list[ActiveRequest],
                 early_verify: bool = True, data_plane: str = "gloo") -> tuple[WaitingVerifier, list[list[int]]]:
    verifier = WaitingVerifier(plane)
    pool = DrafterPool(engine_pb2.EngineInfo(data_plane=data_plane))
    for number, drafter in enumerate(drafters if isinstance(drafters, list) else [drafters]):
        handle = DrafterHandle(f"d:{number + 1}", drafter.drafter_id, "m", 1000, ClosableChannel(), drafter)
        pool.drafters[handle.address] = handle
    config = BatchManagerConfig(mode=mode, k=2, max_batch=4, kv_blocks=1000, block_size=16, step_timeout_s=5.0,
                                early_verify=early_verify)
    manager = BatchManager(config, verifier, pool)
    runner = asyncio.ensure_future(manager.run())
    for req in requests:
        manager.submit(req)
    try:
        outputs = [await streamed_tokens(req) for req in requests]
    finally:
        runner.cancel()
    return verifier, outputs


def _first(log: list[tuple[str, int]], what: str, step_id: int) -> int:
    return log.index((what, step_id))


@pytest.mark.parametrize("mode", ["sd", "psd"])
def test_the_verify_goes_out_with_its_draft_call_and_waits_for_the_drafts(mode):
    async def scenario() -> None:
        plane = DataPlane()
        requests = [active_request("a", 9), active_request("b", 9)]
        verifier, outputs = await _serve(mode, FakeDrafter(plane, "d"), plane, requests)
        assert outputs == [[TOKEN] * 9, [TOKEN] * 9]        # every token once: 3 a step, 3 steps
        drafted = [step for step in verifier.steps if step.sources]
        assert drafted and all(item.num_draft == 2 for step in drafted for item in step.items)
        for step in drafted:                                 # sent before its drafts were drafted
            assert _first(plane.log, "verify sent", step.step_id) < _first(plane.log, "drafted", step.step_id)
        # Once draft calls were timed, the verifier is told how long to wait for drafts.
        assert drafted[-1].drafts_wait_s >= MIN_WAIT_S

    asyncio.run(scenario())


@pytest.mark.parametrize("code, gone", [(grpc.StatusCode.NOT_FOUND, False), (grpc.StatusCode.UNAVAILABLE, True)])
def test_a_failed_draft_call_is_abandoned_at_the_verifier_and_nothing_is_lost(code, gone):
    """The draft call fails after the verify went out: the gateway tells the verifier those
    drafts will not come, and the step verifies at k = 0 at once (the fake verifier would
    give up after DRAFT_WAIT_S and fail the batch). A drafter that is gone leaves the pool;
    one that only failed the call keeps drafting."""
    async def scenario() -> None:
        plane = DataPlane()
        drafter = FakeDrafter(plane, "d", failing=(2,), code=code)
        verifier, outputs = await _serve("sd", drafter, plane, [active_request("a", 10)])
        assert outputs == [[TOKEN] * 10]
        failed = [step for step in verifier.steps if step.sources][1]
        assert ("abandoned", failed.step_id) in plane.log
        assert _first(plane.log, "verify sent", failed.step_id) < _first(plane.log, "abandoned", failed.step_id)
        later = [step for step in verifier.steps if step.step_id > failed.step_id and step.items]
        assert later and all(bool(step.sources) != gone for step in later)

    asyncio.run(scenario())


def test_the_drafts_of_several_failed_drafters_are_abandoned_at_once():
    """Two drafters, each holding one of the batch's requests, both fail the same step: both
    sources are abandoned, concurrently (the verify waits for the last abandon), and the
    step verifies both requests at k = 0."""
    async def scenario() -> None:
        plane = DataPlane()
        drafters = [FakeDrafter(plane, "d1", failing=(2,)), FakeDrafter(plane, "d2", failing=(2,))]
        verifier, outputs = await _serve("sd", drafters, plane, [active_request("a", 10), active_request("b", 10)])
        assert outputs == [[TOKEN] * 10, [TOKEN] * 10]
        failed = [step for step in verifier.steps if len(step.sources) == 2][1]
        assert plane.log.count(("abandoned", failed.step_id)) == 2
        assert verifier.most_abandoning == 2

    asyncio.run(scenario())


@pytest.mark.parametrize("early_verify, data_plane", [(False, "gloo"), (True, "nccl")])
def test_without_early_verify_the_verify_waits_for_the_draft_call(early_verify, data_plane):
    """--no-early-verify, and always with NCCL (which cannot abandon a step's drafts): the
    verify goes once the draft call answered; a failed drafter's requests go with k = 0 and
    its source is left out, and nothing is abandoned."""
    async def scenario() -> None:
        plane = DataPlane()
        drafter = FakeDrafter(plane, "d", failing=(2,))
        verifier, outputs = await _serve("sd", drafter, plane, [active_request("a", 10)], early_verify, data_plane)
        assert outputs == [[TOKEN] * 10]
        drafted = [step for step in verifier.steps if step.sources]
        for step in drafted:
            assert _first(plane.log, "drafted", step.step_id) < _first(plane.log, "verify sent", step.step_id)
        assert not any(what == "abandoned" for what, _ in plane.log)
        failed_step = verifier.steps[1]
        assert not failed_step.sources and [item.num_draft for item in failed_step.items] == [0]
        assert all(step.drafts_wait_s == 0 for step in verifier.steps)

    asyncio.run(scenario())


def test_how_long_a_verify_waits_for_drafts():
    deadlines = Deadlines(floor_s=30.0, factor=10.0)
    assert deadlines.wait_s("draft") == 0.0                 # nothing timed yet: the verifier's default
    deadlines.observe("draft", 0.03)
    assert deadlines.wait_s("draft") == pytest.approx(0.3)  # ten of the slowest recent, no floor
    assert deadlines.wait_s("draft", predicted_s=0.5) == pytest.approx(5.0)
    deadlines.observe("draft", 0.001)
    assert deadlines.wait_s("draft", predicted_s=0.001) == pytest.approx(0.3)
    small = Deadlines(floor_s=30.0, factor=10.0)
    small.observe("draft", 0.001)
    assert small.wait_s("draft") == MIN_WAIT_S
