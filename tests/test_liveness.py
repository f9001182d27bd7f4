"""The gateway's liveness pieces in-process, with fake services: no call without a deadline,
no stray CancelledError ending the Batch Manager, no background task ending unobserved."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from gateway_helpers import ClosableChannel, active_request

from gateway.batch_manager import BatchManager, BatchManagerConfig, Overloaded
from gateway.engine_calls import DRAFT_FLOOR_S, SETTLED_CALLS, CallCancelled, Deadlines, call_status, guarded
from gateway.liveness import supervise
from gateway.pool import DrafterHandle, DrafterPool
from gateway.request import ActiveRequest
from minedraft.v1 import engine_pb2


class FakeVerifier:
    """Answers every verify step with one token per item; records the deadlines it was given."""

    def __init__(self) -> None:
        self.timeouts: list[float | None] = []

    async def Step(self, request, timeout=None):
        self.timeouts.append(timeout)
        return engine_pb2.VerifyStepResponse(step_id=request.step_id, results=[
            engine_pb2.VerifyResult(request_id=item.request_id, token_ids=[7]) for item in request.items])


class ClosedChannelDrafter:
    """A drafter whose calls end as grpc.aio ends them when the channel is closed under them."""

    async def Step(self, request, timeout=None):
        raise asyncio.CancelledError()


def _request(request_id: str, max_tokens: int = 3) -> ActiveRequest:
    return active_request(request_id, max_tokens)


def _config(mode: str = "psd", **overrides) -> BatchManagerConfig:
    return BatchManagerConfig(**{"mode": mode, "k": 2 if mode != "ar" else 0, "max_batch": 4, "kv_blocks": 1000,
                                 "block_size": 16, "step_timeout_s": 5.0, **overrides})


def test_deadlines_grow_with_measured_calls_and_never_fall_below_the_floor():
    deadlines = Deadlines(floor_s=2.0, factor=10.0, window=3)
    assert deadlines("verify") == 2.0
    deadlines.observe("verify", 0.5)
    assert deadlines("verify") == 5.0
    for _ in range(3):                          # the slow call leaves the window
        deadlines.observe("verify", 0.01)
    assert deadlines("verify") == 2.0
    assert deadlines("draft") == 2.0
    with pytest.raises(ValueError):
        Deadlines(floor_s=0)


def test_a_drafter_that_has_answered_enough_calls_gets_the_short_floor_and_the_verifier_never():
    """A hung drafter holds every stream until its call's deadline: after start-up (the
    first SETTLED_CALLS calls) a draft call's least deadline is DRAFT_FLOOR_S, not the
    30 s start-up floor; the verifier's calls keep the floor (missing one fails a batch)."""
    deadlines = Deadlines(floor_s=30.0, factor=10.0, window=4)
    for _ in range(SETTLED_CALLS - 1):
        deadlines.observe("draft", 0.01)
        deadlines.observe("verify", 0.01)
    assert deadlines("draft") == 30.0
    deadlines.observe("draft", 0.01)
    deadlines.observe("verify", 0.01)
    assert deadlines("draft") == DRAFT_FLOOR_S < 30.0
    assert deadlines("verify") == 30.0
    assert deadlines("draft", predicted_s=1.0) == 10.0          # a long call still gets its time
    deadlines.observe("draft", 0.5)
    assert deadlines("draft") == 5.0


def test_a_call_predicted_long_gets_a_deadline_to_match():
    """A wave of prompts prefilled in one verify may take far longer than the decode steps
    before it: its deadline follows the cost model's prediction for it."""
    deadlines = Deadlines(floor_s=2.0, factor=10.0, window=3)
    for _ in range(3):
        deadlines.observe("verify", 0.5)
    assert deadlines("verify", predicted_s=0.1) == 5.0
    assert deadlines("verify", predicted_s=30.0) == 300.0
    assert deadlines("draft", predicted_s=0.01) == 2.0


def test_a_call_cancelled_by_its_channel_is_a_failed_call_not_a_cancelled_task():
    async def scenario() -> None:
        with pytest.raises(CallCancelled):
            await guarded(ClosedChannelDrafter().Step(None), "draft")
        assert call_status(CallCancelled("x"))[0] == grpc.StatusCode.CANCELLED

        async def slow() -> None:
            await asyncio.sleep(10)

        task = asyncio.ensure_future(guarded(slow(), "draft"))
        await asyncio.sleep(0.01)
        task.cancel()                           # the caller's own cancellation still cancels
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())


def test_a_drafter_leaving_while_its_idle_free_call_is_cut_keeps_the_batch_manager_serving():
    """The bug this guards: closing a leaving drafter's channel cancelled the idle-time free
    call in flight to it, the CancelledError escaped the pipeline and generation stopped for
    good while health said SERVING."""
    async def scenario() -> None:
        verifier = FakeVerifier()
        pool = DrafterPool(engine_pb2.EngineInfo())
        manager = BatchManager(_config(), verifier, pool)
        handle = DrafterHandle("d:1", "id", "m", 1000, ClosableChannel(), ClosedChannelDrafter())
        handle.pending_frees.append("finished-earlier")
        pool.drafters[handle.address] = handle
        runner = asyncio.ensure_future(manager.run())
        await asyncio.sleep(0.1)               # idle: the pipelines flush frees, the call is cut
        assert not runner.done(), runner.exception() if runner.done() else None
        pool.drafters.clear()                  # it left: requests run at k = 0
        req = _request("r1")
        manager.submit(req)
        events = []
        while not events or events[-1].finish_reason is None:
            events.append(await asyncio.wait_for(req.events.get(), 5))
        assert [t for e in events for t in e.token_ids] == [7, 7, 7]
        assert all(timeout is not None and timeout > 0 for timeout in verifier.timeouts)
        runner.cancel()

    asyncio.run(scenario())


def test_the_queue_is_bounded():
    async def scenario() -> None:
        manager = BatchManager(_config("ar", max_batch=1, max_waiting=2), FakeVerifier(), None)
        for name in ("a", "b", "c"):           # one admitted to the batch, two waiting
            manager.submit(_request(name))
        with pytest.raises(Overloaded, match="2 requests waiting"):
            manager.submit(_request("d"))

    asyncio.run(scenario())


class FakeServed:
    def __init__(self) -> None:
        self.serving: list[bool] = []
        never = asyncio.get_running_loop().create_future()

        class Server:
            async def wait_for_termination(self) -> None:
                await never

        self.server = Server()

    async def set_serving(self, serving: bool) -> None:
        self.serving.append(serving)


def test_a_batch_manager_that_stops_is_fatal_and_turns_health_not_serving():
    class BrokenManager:
        async def run(self) -> None:
            raise RuntimeError("a bug")

    class IdleWatch:
        async def run(self) -> None:
            await asyncio.sleep(3600)

    async def scenario() -> list[bool]:
        served = FakeServed()
        with pytest.raises(SystemExit) as exit_info:
            await supervise(BrokenManager(), served, IdleWatch())
        assert exit_info.value.code == 1
        return served.serving

    assert asyncio.run(scenario()) == [False]


def test_a_request_no_drafter_could_hold_runs_at_k0_instead_of_blocking_the_queue():
    async def scenario() -> None:
        pool = DrafterPool(engine_pb2.EngineInfo())
        small = DrafterHandle("d:1", "id", "m", 2, ClosableChannel(), ClosedChannelDrafter())   # 2 blocks
        pool.drafters[small.address] = small
        manager = BatchManager(_config(), FakeVerifier(), pool)
        big, tiny = _request("big", max_tokens=100), _request("tiny", max_tokens=1)
        manager.submit(big)
        manager.submit(tiny)
        assert not manager.admission.waiting                  # neither waits behind the other
        assert big.drafter is None and tiny.drafter is small

    asyncio.run(scenario())
