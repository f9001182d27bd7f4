"""Auto mode's batches around a change of plan. A burst that arrives while a one-batch plan
is in force is split between the two batches at the first step boundary where the plan
becomes psd, before either batch steps, so its prompts are prefilled as two overlapped
halves rather than as one batch. After plain decoding, the steps in which the drafter
catches up do not count towards the switch settling (they would be measured as the new
layout's speed). In-process, with the fake services of test_early_verify and choosers
fixed by the test."""

from __future__ import annotations

import asyncio

import pytest
from gateway_helpers import ClosableChannel, active_request, streamed_tokens
from test_early_verify import TOKEN, DataPlane, FakeDrafter, WaitingVerifier

import gateway.auto
import gateway.batch_manager
from gateway.batch_manager import BatchManager, BatchManagerConfig
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


def test_steps_that_catch_the_drafter_up_after_plain_decoding_do_not_settle_the_switch(monkeypatch):
    plan = {"layout": "ar"}

    def fixed(costs, requests, k_max, layouts=("ar", "sd", "psd"), **_) -> Plan:
        layout = plan["layout"]
        ids = [r.request_id for r in requests]
        return Plan(layout, {i: 0 if layout == "ar" else k_max for i in ids}, (tuple(ids),), 0.01, 100.0,
                    {layout: 100.0}, threshold=0.0, cap=0 if layout == "ar" else k_max)

    _plan_with(monkeypatch, fixed)

    async def scenario() -> None:
        plane = DataPlane()
        verifier = WaitingVerifier(plane)
        pool = DrafterPool(engine_pb2.EngineInfo(data_plane="gloo"))
        pool.drafters["d:1"] = DrafterHandle("d:1", "d", "m", 1000, ClosableChannel(), FakeDrafter(plane, "d"))
        config = BatchManagerConfig(mode="auto", k=2, max_batch=8, kv_blocks=1000, block_size=16,
                                    step_timeout_s=5.0)
        manager = BatchManager(config, verifier, pool)
        manager.planner.replan_interval_s = 0.0             # a plan at every step boundary
        observed = []
        observe = manager.planner.observe_step

        def recording(layout, tokens, prompt_tokens, batch=None):
            observed.append(layout)
            observe(layout, tokens, prompt_tokens, batch)
            if observed.count("ar") == 6:                   # six tokens each, the drafter unaware
                plan["layout"] = "sd"                       # (switched here: a step takes no time)

        manager.planner.observe_step = recording
        runner = asyncio.ensure_future(manager.run())
        requests = [active_request("a", 40), active_request("b", 40)]
        for req in requests:
            manager.submit(req)
        try:
            for req in requests:
                assert await streamed_tokens(req) == [TOKEN] * 40
        finally:
            runner.cancel()
        drafted = [step for step in verifier.steps if step.sources]
        first_sd = observed.index("sd")
        # The first drafted step took in every token so far: it does not count; the next do.
        assert observed[first_sd - 1] == "" and observed[first_sd:first_sd + 3] == ["sd"] * 3
        assert len(drafted) >= 4 and all(item.num_draft == 2 for item in drafted[1].items)

    asyncio.run(scenario())
