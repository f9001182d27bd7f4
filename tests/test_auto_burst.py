"""Auto mode's batches around a change of plan. A burst that arrives while a one-batch plan
is in force is split between the two batches at the first step boundary where the plan
becomes psd, before either batch steps, so its prompts are prefilled as two overlapped
halves rather than as one batch. After plain decoding, the steps in which the drafter
catches up do not count towards the switch settling (they would be measured as the new
layout's speed). On the way from plain decoding to drafting the drafter catches up on a
call of its own while plain steps go on. In-process, with the fake services of
test_early_verify and choosers fixed by the test."""

from __future__ import annotations

import asyncio

import pytest
from gateway_helpers import ClosableChannel, active_request, streamed_tokens
from test_early_verify import TOKEN, DataPlane, FakeDrafter, WaitingVerifier

import gateway.auto
import gateway.batch_manager
from gateway.batch_manager import BatchManager, BatchManagerConfig
from gateway.cost_model import CostModel, StepCosts
from gateway.planner import Plan
from gateway.pool import DrafterHandle, DrafterPool
from minedraft.v1 import engine_pb2


class GatedVerifier(WaitingVerifier):
    """Holds its first step until `gate` is set, so a burst can arrive while it runs."""

    def __init__(self, plane: DataPlane) -> None:
        super().__init__(plane)
        self.gate = asyncio.Event()

    async def Step(self, request, timeout=None):
        if request.items and not any(step.items for step in self.steps):
            self.steps.append(request)
            await self.gate.wait()
            self.steps.pop()
        return await super().Step(request, timeout)


def _by_count(costs, requests, k_max, layouts=("ar", "sd", "psd"), **_) -> Plan:
    """sd for one request, psd for more (where allowed); only the chosen layout is
    considered, so nothing is explored."""
    layout = "sd" if len(requests) < 2 or "psd" not in layouts else "psd"
    ids = [r.request_id for r in requests]
    batches = (tuple(ids[0::2]), tuple(ids[1::2])) if layout == "psd" else (tuple(ids),)
    return Plan(layout, {i: k_max for i in ids}, batches, 0.01, 100.0, {layout: 100.0}, threshold=0.0, cap=k_max)


def _plan_with(monkeypatch, chooser) -> None:
    """Auto mode plans with `chooser` instead of choose_plan, and skips its start-up profile."""
    async def no_profile(*_args, **_kwargs) -> None:
        return None

    monkeypatch.setattr(gateway.batch_manager, "profile", no_profile)
    monkeypatch.setattr(gateway.auto, "choose_plan", chooser)


@pytest.fixture
def planned_by_count(monkeypatch):
    _plan_with(monkeypatch, _by_count)


def test_a_burst_under_a_one_batch_plan_is_split_before_either_batch_steps(planned_by_count):
    async def scenario() -> None:
        plane = DataPlane()
        verifier = GatedVerifier(plane)
        drafter = FakeDrafter(plane, "d")
        pool = DrafterPool(engine_pb2.EngineInfo(data_plane="gloo"))
        pool.drafters["d:1"] = DrafterHandle("d:1", "d", "m", 1000, ClosableChannel(), drafter)
        config = BatchManagerConfig(mode="auto", k=2, max_batch=8, kv_blocks=1000, block_size=16,
                                    step_timeout_s=5.0)
        manager = BatchManager(config, verifier, pool)
        runner = asyncio.ensure_future(manager.run())
        first = active_request("r0", 9)
        manager.submit(first)
        while not verifier.steps:                       # the lone request's step is running ...
            await asyncio.sleep(0.005)
        burst = [active_request(f"r{i}", 9) for i in range(1, 8)]
        for req in burst:                               # ... when seven more arrive
            manager.submit(req)
        verifier.gate.set()
        try:
            outputs = [await streamed_tokens(req) for req in [first, *burst]]
        finally:
            runner.cancel()
        assert outputs == [[TOKEN] * 9] * 8                # every token once
        steps = [step for step in verifier.steps if step.items]
        assert [item.request_id for item in steps[0].items] == ["r0"]
        # The next two steps are the two batches' first: halves of the eight, overlapped.
        halves = [{item.request_id for item in step.items} for step in steps[1:3]]
        assert [len(half) for half in halves] == [4, 4]
        assert halves[0] | halves[1] == {f"r{i}" for i in range(8)}
        assert max(len(step.items) for step in steps) == 4

    asyncio.run(scenario())


def _ar_then_sd(monkeypatch, after_steps: int, observed: list[str], received: list | None = None):
    """Plain decoding until `after_steps` plain steps came back, then sd; -> the manager's
    observe_step wrapper to install (it records each step's layout in `observed`, and its
    tokens and the tokens expected of it in `received`)."""
    plan = {"layout": "ar"}

    def fixed(costs, requests, k_max, layouts=("ar", "sd", "psd"), **_) -> Plan:
        layout = plan["layout"]
        ids = [r.request_id for r in requests]
        return Plan(layout, {i: 0 if layout == "ar" else k_max for i in ids}, (tuple(ids),), 0.01, 100.0,
                    {layout: 100.0}, threshold=0.0, cap=0 if layout == "ar" else k_max)

    _plan_with(monkeypatch, fixed)

    def wrap(observe):
        def recording(layout, tokens, prompt_tokens, batch=None, expected=None):
            observed.append(layout)
            if received is not None:
                received.append((tokens, expected))
            observe(layout, tokens, prompt_tokens, batch, expected)
            if observed.count("ar") == after_steps:
                plan["layout"] = "sd"
        return recording
    return wrap


class PacedVerifier(WaitingVerifier):
    """Takes 10 ms a step, one step at a time as the real one does, so that steps can run
    beside a drafter's call."""

    def __init__(self, plane: DataPlane) -> None:
        super().__init__(plane)
        self.computing = asyncio.Lock()

    async def Step(self, request, timeout=None):
        async with self.computing:
            await asyncio.sleep(0.01)
            response = await super().Step(request, timeout)
        self.plane.log.append(("verified", request.step_id))
        return response


async def _serve_two(drafter: FakeDrafter, plane: DataPlane, wrap, verifier: WaitingVerifier,
                     model: CostModel | None = None, max_tokens: int = 40):
    """Requests a and b (max_tokens each) through an auto-mode Batch Manager that plans at
    every step boundary; -> their streamed tokens."""
    pool = DrafterPool(engine_pb2.EngineInfo(data_plane="gloo"))
    pool.drafters["d:1"] = DrafterHandle("d:1", "d", "m", 1000, ClosableChannel(), drafter)
    config = BatchManagerConfig(mode="auto", k=2, max_batch=8, kv_blocks=1000, block_size=16, step_timeout_s=5.0)
    manager = BatchManager(config, verifier, pool)
    manager.planner.replan_interval_s = 0.0             # a plan at every step boundary
    manager.planner.observe_step = wrap(manager.planner.observe_step)
    if model is not None:
        manager.planner.model = manager.calls.model = model
    runner = asyncio.ensure_future(manager.run())
    requests = [active_request("a", max_tokens), active_request("b", max_tokens)]
    for req in requests:
        manager.submit(req)
    try:
        return [await streamed_tokens(req) for req in requests]
    finally:
        runner.cancel()


def _dear_catch_up() -> CostModel:
    """The drafter takes a prompt token in at 10 ms (the fake drafter reports no such price):
    catching up takes longer than a plain step."""
    return CostModel(StepCosts(1e-3, 1e-4, 1e-3, 5e-3, 5e-4, 5e-4, draft_per_new_token=1e-2))


def test_steps_that_catch_the_drafter_up_after_plain_decoding_do_not_settle_the_switch(monkeypatch):
    observed: list[str] = []
    received: list[tuple[int, float | None]] = []
    wrap = _ar_then_sd(monkeypatch, 6, observed, received)     # six tokens each, the drafter unaware
    # Where a catch-up does not pay (a catch-up of its own is the next test's), the first
    # drafting step takes every token in.
    monkeypatch.setattr(BatchManager, "_catch_up_pays", lambda self, tokens, batch: False)

    async def scenario() -> None:
        plane = DataPlane()
        verifier = WaitingVerifier(plane)               # (a step takes no time)
        drafter = FakeDrafter(plane, "d")
        outputs = await _serve_two(drafter, plane, wrap, verifier)
        assert outputs == [[TOKEN] * 40] * 2
        assert not drafter.catch_ups
        drafted = [step for step in verifier.steps if step.sources]
        first_sd = observed.index("sd")
        # The first drafted step took in every token so far: it does not count; the next do.
        assert observed[first_sd - 1] == "" and observed[first_sd:first_sd + 3] == ["sd"] * 3
        assert len(drafted) >= 4 and all(item.num_draft == 2 for item in drafted[1].items)
        # A drafted step is expected to give each request 1 + the reach of its two drafts
        # (here every draft is accepted, more than any estimate foresees); a plain step what
        # it gave.
        assert all(expected == tokens for (tokens, expected), layout in zip(received, observed) if layout == "ar")
        tokens, expected = received[first_sd + 1]
        assert tokens == 6 and 2 < expected < 6

    asyncio.run(scenario())


def test_the_drafter_catches_up_beside_plain_steps_before_drafting_resumes(monkeypatch):
    observed: list[str] = []
    wrap = _ar_then_sd(monkeypatch, 6, observed)

    async def scenario() -> None:
        plane = DataPlane()
        drafter = FakeDrafter(plane, "d")
        drafter.catch_up_s = 0.05                       # long enough for a few plain steps
        verifier = PacedVerifier(plane)
        outputs = await _serve_two(drafter, plane, wrap, verifier, _dear_catch_up())
        assert outputs == [[TOKEN] * 40] * 2            # every token once
        # A catch-up call, drafting nothing, with each request's every token so far (six
        # plain steps or more: those in flight at the switch came back first); then another
        # with what was verified meanwhile, no more than half as many.
        catch_up = drafter.catch_ups[0]
        sizes = [sum(len(new.token_ids) for new in c.new_requests) + sum(len(diff.new_token_ids) for diff in c.updates)
                 for c in drafter.catch_ups]
        assert all(2 * later <= earlier for earlier, later in zip(sizes, sizes[1:])), sizes
        assert [item.num_draft for item in catch_up.items] == [0, 0]
        assert [r.request_id for r in catch_up.new_requests] == ["a", "b"]
        for new in catch_up.new_requests:
            assert list(new.token_ids) == [1, 2, 3] + [TOKEN] * (len(new.token_ids) - 3) and len(new.token_ids) >= 9
        # Plain steps went on meanwhile, on the verifier's own cores ...
        sent, done = plane.log.index(("catch-up sent", catch_up.step_id)), plane.log.index(("caught up", catch_up.step_id))
        during = {step for what, step in plane.log[sent:done] if what == "verify sent"}
        beside = [step for step in verifier.steps if step.step_id in during]
        assert len(beside) >= 2 and all(not step.sources and not step.borrow_cpus for step in beside)
        # It started once the steps on the drafter's cores were back.
        lent = [step.step_id for step in verifier.steps if step.borrow_cpus]
        assert lent and all(plane.log.index(("verified", step)) < sent for step in lent)
        # ... and the first drafting step carried only what was verified beside the last.
        first = drafter.drafts[0]
        assert not first.new_requests and first.step_id > drafter.catch_ups[-1].step_id
        assert all(len(diff.new_token_ids) <= len(beside) + 2 for diff in first.updates)
        assert {item.num_draft for item in first.items} == {2}
        # Those plain steps are not the new layout's: they do not settle the switch.
        assert "sd" in observed and observed.index("sd") > observed.index("ar") + 6

    asyncio.run(scenario())


def test_a_failed_catch_up_loses_nothing_and_drafting_resumes(monkeypatch):
    observed: list[str] = []
    wrap = _ar_then_sd(monkeypatch, 4, observed)

    async def scenario() -> None:
        plane = DataPlane()
        drafter = FakeDrafter(plane, "d")
        drafter.failing_catch_ups = 1
        verifier = PacedVerifier(plane)
        outputs = await _serve_two(drafter, plane, wrap, verifier, _dear_catch_up())
        assert outputs == [[TOKEN] * 40] * 2
        # Re-homed, the requests had all their tokens to catch up again, not half as many:
        # the first drafting step took them in (afresh, as new requests).
        assert len(drafter.catch_ups) == 1
        assert {r.request_id for r in drafter.drafts[0].new_requests} == {"a", "b"}
        assert any(step.sources for step in verifier.steps)

    asyncio.run(scenario())
