"""Every request a service was told about is freed there, whatever the moment a client goes
away: in-process, with fake services that hold requests as the real ones do and that may
receive two calls in flight in either order (gRPC does not order concurrent calls).

The bug this guards: a request cancelled after its batch chose it for a draft step but
before the draft call went out was forgotten by the gateway, then added to the drafter by
that call, and never freed there (CI saw one request left on a drafter for good)."""

from __future__ import annotations

import asyncio
import random

import grpc
import grpc.aio
import pytest
from gateway_helpers import ClosableChannel, active_request

from gateway.batch_manager import BatchManager, BatchManagerConfig
from gateway.pool import DrafterHandle, DrafterPool
from gateway.request import ActiveRequest
from minedraft.v1 import engine_pb2


def _refusal(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


class HoldingService:
    """Holds requests like a real service: frees first (unknown ids ignored), then new
    requests (a known one is refused), then every named request must be held. A call
    'arrives' after a random number of loop turns, so two calls in flight may be applied
    in either order; each is applied at once, as the real service's single thread does."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.held: set[str] = set()
        self.ever_added: set[str] = set()

    async def _arrive(self) -> None:
        for _ in range(self.rng.randrange(4)):
            await asyncio.sleep(0)

    def _apply(self, request, named: list[str]) -> None:
        if getattr(request, "reset", False):
            self.held.clear()
        self.held.difference_update(request.finished)
        for new in request.new_requests:
            if new.request_id in self.held:
                raise _refusal(grpc.StatusCode.INVALID_ARGUMENT, f"request {new.request_id!r} already exists")
        self.held.update(new.request_id for new in request.new_requests)
        self.ever_added.update(new.request_id for new in request.new_requests)
        unknown = [rid for rid in named if rid not in self.held]
        if unknown:
            raise _refusal(grpc.StatusCode.NOT_FOUND, f"unknown request {unknown[0]!r}")


class FakeDrafter(HoldingService):
    async def Step(self, request, timeout=None):
        await self._arrive()
        self._apply(request, [u.request_id for u in request.updates] + [i.request_id for i in request.items])
        await asyncio.sleep(self.rng.random() * 0.002)
        return engine_pb2.DraftStepResponse(step_id=request.step_id, busy_s=0.001)


class FakeVerifier(HoldingService):
    """One token per verified item; a dropped item (its request ended) gets no result. A step
    queued behind another (after_step_id, plain decoding) is applied after it, as the real
    verifier does."""

    def __init__(self, rng: random.Random) -> None:
        super().__init__(rng)
        self.applied: set[int] = set()

    async def Step(self, request, timeout=None):
        await self._arrive()
        while request.after_step_id and request.after_step_id not in self.applied:
            await asyncio.sleep(0)
        self.applied.add(request.step_id)
        self._apply(request, [i.request_id for i in request.items if not i.drop])
        await asyncio.sleep(self.rng.random() * 0.002)
        return engine_pb2.VerifyStepResponse(step_id=request.step_id, busy_s=0.001, results=[
            engine_pb2.VerifyResult(request_id=i.request_id, num_draft=i.num_draft, token_ids=[7])
            for i in request.items if not i.drop])


async def _finish(req: ActiveRequest) -> list:
    events = []
    while not events or events[-1].finish_reason is None:
        events.append(await asyncio.wait_for(req.events.get(), 10))
    return events


def _manager(mode: str, rng: random.Random, drafter_class: type[FakeDrafter] = FakeDrafter
             ) -> tuple[FakeVerifier, FakeDrafter, BatchManager]:
    """A Batch Manager in `mode` over a fake verifier and one fake drafter (auto mode cycles
    the layouts every two steps)."""
    verifier, drafter = FakeVerifier(rng), drafter_class(rng)
    pool = DrafterPool(engine_pb2.EngineInfo())
    pool.drafters["d:1"] = DrafterHandle("d:1", "id", "m", 10_000, ClosableChannel(), drafter)
    manager = BatchManager(BatchManagerConfig(mode=mode, k=2 if mode != "ar" else 0, max_batch=4,
                                              kv_blocks=10_000, block_size=16, step_timeout_s=5.0,
                                              auto_cycle_steps=2 if mode == "auto" else 0), verifier, pool)
    return verifier, drafter, manager


@pytest.mark.parametrize("mode", ["psd", "sd", "ar", "auto"])
def test_requests_cancelled_at_any_moment_are_freed_on_every_service(mode):
    async def scenario(seed: int) -> None:
        rng = random.Random(seed)
        verifier, drafter, manager = _manager(mode, rng)
        runner = asyncio.ensure_future(manager.run())

        async def client(req: ActiveRequest, cancel_after: int | None) -> None:
            if cancel_after is not None:
                for _ in range(cancel_after):
                    await asyncio.sleep(0)
                manager.cancel(req.request_id)
            events = await _finish(req)
            assert events[-1].finish_reason is not None and not getattr(events[-1], "error", None)

        clients = []
        for i in range(40):
            req = active_request(f"r{i}", max_tokens=rng.randrange(1, 6))
            manager.submit(req)
            clients.append(client(req, rng.randrange(40) if rng.random() < 0.7 else None))
            if rng.random() < 0.3:
                await asyncio.sleep(0)
        await asyncio.gather(*clients)
        for _ in range(200):                   # idle: the pipelines flush what is left
            if not verifier.held and not drafter.held:
                break
            await asyncio.sleep(0.005)
        assert not runner.done(), runner.exception() if runner.done() else None
        runner.cancel()
        assert verifier.held == set() and drafter.held == set(), (verifier.held, drafter.held)
        if mode != "ar":
            assert drafter.ever_added                  # the drafter did hold requests on the way

    for seed in range(30):
        asyncio.run(scenario(seed))


class CatchUpHoldingDrafter(FakeDrafter):
    """Holds its first catch-up call (auto mode, on the way from plain decoding to drafting)
    until released: the request it names is taken in at once, the answer waits."""

    def __init__(self, rng: random.Random) -> None:
        super().__init__(rng)
        self.catching_up = asyncio.Event()
        self.release = asyncio.Event()

    async def Step(self, request, timeout=None):
        if request.catch_up and not self.catching_up.is_set():
            self._apply(request, [i.request_id for i in request.items])
            self.catching_up.set()
            await self.release.wait()
            return engine_pb2.DraftStepResponse(step_id=request.step_id, busy_s=0.001)
        return await super().Step(request, timeout)


def test_a_request_cancelled_during_a_catch_up_is_freed_once_it_answers_though_the_gateway_went_idle():
    """The catch-up call outlives the plain steps: the request is cancelled, its last plain
    step answers and the pipelines go idle (their flush must keep the drafter's free back:
    the call in flight names the request). When the catch-up answers, the free goes."""
    async def scenario() -> None:
        verifier, drafter, manager = _manager("auto", random.Random(0), CatchUpHoldingDrafter)
        runner = asyncio.ensure_future(manager.run())
        req = active_request("r0", max_tokens=1000)
        manager.submit(req)
        await asyncio.wait_for(drafter.catching_up.wait(), 10)
        assert "r0" in drafter.held
        manager.cancel("r0")
        events = await _finish(req)
        assert events[-1].finish_reason is not None
        for _ in range(100):                   # the plain steps end; the pipelines go idle
            if not verifier.held and not manager.steps_in_flight:
                break
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.05)
        assert not verifier.held and "r0" in drafter.held       # held back: the catch-up names it
        drafter.release.set()
        for _ in range(100):
            if not drafter.held:
                break
            await asyncio.sleep(0.005)
        assert not runner.done(), runner.exception() if runner.done() else None
        runner.cancel()
        assert drafter.held == set()

    asyncio.run(scenario())


class CatchUpRecordingDrafter(FakeDrafter):
    def __init__(self, rng: random.Random) -> None:
        super().__init__(rng)
        self.caught_up: set[str] = set()            # every request a catch-up call named

    async def Step(self, request, timeout=None):
        if request.catch_up:
            self.caught_up.update(i.request_id for i in request.items)
        return await super().Step(request, timeout)


def test_a_request_that_ended_before_its_catch_up_went_out_is_not_given_to_the_drafter():
    """The drafter would first hear of r1 from the catch-up (it came during plain
    decoding); r1 is cancelled after the catch-up was decided but before its call went out.
    The call must not name it: r1 was taken off the drafter while unknown there, so nothing
    would free it. r0, live, still catches up."""
    async def scenario() -> None:
        verifier, drafter, manager = _manager("auto", random.Random(0), CatchUpRecordingDrafter)
        kept, ended = active_request("r0", max_tokens=1000), active_request("r1", max_tokens=1000)
        for req in (kept, ended):
            manager.submit(req)
        drafting = manager._placed_to_draft([kept, ended])
        assert [req.request_id for req in drafting] == ["r0", "r1"] and not ended.known_to_drafter
        catch_up = manager._catch_up(drafting)
        manager.cancel("r1")                    # (in no batch's step: retired at once)
        assert ended.done and ended.drafter is None
        await asyncio.wait_for(catch_up, 10)
        await asyncio.sleep(0)                  # (its done callback)
        assert drafter.caught_up == {"r0"} and drafter.held == {"r0"} and manager._catching_up == 0

    asyncio.run(scenario())
