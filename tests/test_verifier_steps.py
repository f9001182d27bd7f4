"""How the verifier's driver resolves a step's drafts from several drafters of a pool: each
request gets exactly its drafter's rows, and drafts lost with their drafter are verified
at k = 0."""

from __future__ import annotations

import pytest
import torch

from minedraft.config import RunnerConfig
from minedraft.data_plane import DraftPayload
from minedraft.model_runner import ModelRunner
from minedraft.parallel import TPGroup
from minedraft.sampling_params import SamplingParams
from minedraft.v1 import engine_pb2
from minedraft.verifier import Verifier
from verifier_svc.steps import StepExecutor


class FakePairings:
    last_wait_s = 0.0

    def __init__(self, payloads: dict[str, DraftPayload | None]) -> None:
        self.payloads = payloads
        self.asked: dict[str, tuple[int, int]] = {}

    def recv(self, drafter_id, step_id, num_tokens, timeout_s=60.0):
        self.asked[drafter_id] = (step_id, num_tokens)
        return self.payloads[drafter_id]

    def ever_paired(self, drafter_id) -> bool:
        return drafter_id in self.payloads


@pytest.fixture(scope="module")
def executor(tiny_checkpoints) -> StepExecutor:
    runner = ModelRunner(RunnerConfig(model_path=str(tiny_checkpoints["qwen3"]), block_size=4, num_blocks=64))
    return StepExecutor(Verifier(runner), TPGroup.single())


def _request(items, sources) -> engine_pb2.VerifyStepRequest:
    return engine_pb2.VerifyStepRequest(
        step_id=9, items=[engine_pb2.VerifyItem(request_id=r, num_draft=k, source=s) for r, k, s in items],
        sources=[engine_pb2.DraftSource(drafter_id=d, draft_step_id=step) for d, step in sources])


def test_drafts_of_three_drafters_resolve_per_request(executor):
    pairings = FakePairings({
        "first": DraftPayload(7, torch.tensor([10, 11, 12])),
        "second": DraftPayload(8, torch.tensor([20])),
        "gone": None,
    })
    request = _request(items=[("r0", 2, 0), ("r1", 1, 1), ("r2", 2, 2), ("r3", 1, 0), ("r4", 0, 0)],
                       sources=[("first", 7), ("second", 8), ("gone", 6)])
    resolved, token_ids, *_ = executor._collect(request, pairings)
    assert pairings.asked == {"first": (7, 3), "second": (8, 1), "gone": (6, 2)}
    assert [(i.request_id, i.num_draft) for i in resolved.items] == [
        ("r0", 2), ("r1", 1), ("r2", 0), ("r3", 1), ("r4", 0)]          # r2's drafts were lost
    assert token_ids.tolist() == [10, 11, 20, 12]
    assert not resolved.sources                 # what the other ranks get names no drafter


def test_bad_sources_are_refused(executor):
    pairings = FakePairings({"a": DraftPayload(3, torch.tensor([5, 6]))})
    resolved, token_ids, *_ = executor._collect(_request(items=[("x", 2, 0)], sources=[("a", 3)]), pairings)
    assert token_ids.tolist() == [5, 6] and not resolved.sources
    with pytest.raises(ValueError, match="source"):
        executor._collect(_request(items=[("x", 2, 1)], sources=[("a", 3)]), pairings)


def test_a_drafter_that_never_paired_is_not_found_and_nothing_is_received(executor):
    """Drafts of a drafter that left are lost (k = 0); a drafter this verifier never paired
    with is nonsense, refused before any draft is taken off the data plane."""
    from minedraft.engine_requests import UnknownRequest

    pairings = FakePairings({"known": None})
    with pytest.raises(UnknownRequest, match="sources: drafter 'stranger' never paired"):
        executor.lead(_request(items=[], sources=[("known", 1), ("stranger", 1)]), pairings)
    assert pairings.asked == {}


def test_an_early_verify_waits_for_its_drafts_as_long_as_it_is_told_and_reports_the_wait(executor):
    """Sent with its draft call, a verify may reach the verifier before its drafts exist:
    the wait for them is reported apart from taking them off the data plane, and it lasts at
    most drafts_wait_s from when the verifier is ready for them (then the drafts are lost,
    k = 0, rather than every other batch waiting behind a hung drafter)."""
    import threading
    import time

    from minedraft.data_plane import DraftPairings

    pairings = DraftPairings("inband", "127.0.0.1", "127.0.0.1")
    pairings.connect("d")
    threading.Timer(0.3, pairings.deliver, args=("d", DraftPayload(5, torch.tensor([1, 2])))).start()
    request = _request(items=[("r", 2, 0)], sources=[("d", 5)])
    request.drafts_wait_s = 10.0
    resolved, token_ids, recv_s, waited_s = executor._collect(request, pairings)
    assert token_ids.tolist() == [1, 2] and 0.25 < waited_s < 5 and recv_s < 0.1

    request = _request(items=[("r", 2, 0)], sources=[("d", 6)])     # never drafted
    request.drafts_wait_s = 0.2
    started = time.monotonic()
    resolved, token_ids, *_ = executor._collect(request, pairings, recv_deadline=time.monotonic() + 60)
    assert time.monotonic() - started < 5
    assert [i.num_draft for i in resolved.items] == [0] and token_ids.numel() == 0

    for bad in (-1.0, float("inf"), float("nan")):
        request.drafts_wait_s = bad
        with pytest.raises(ValueError, match="drafts_wait_s"):
            executor._collect(request, pairings)


def test_lost_drafts_still_give_one_token(executor):
    """A request whose drafts are lost gets a plain decoding step: one token, the target's."""
    verifier = executor.verifier
    verifier.add_request("p", [3, 4, 5, 6], SamplingParams(), seed=0)
    try:
        response = executor.lead(_request(items=[("p", 3, 0)], sources=[("gone", 1)]),
                                 FakePairings({"gone": None}))
        assert [(r.request_id, r.num_draft, len(r.token_ids)) for r in response.results] == [("p", 0, 1)]
    finally:
        verifier.remove_request("p")


def test_a_step_naming_its_predecessor_runs_after_it_whatever_the_arrival_order():
    """Plain decoding sends step n + 1 before step n answers; if n + 1 arrives first it must
    still run second (its tokens follow n's)."""
    import asyncio

    from verifier_svc.servicer import VerifierServicer

    ran: list[int] = []

    class RecordingExecutor:
        def lead(self, request, pairings):
            ran.append(request.step_id)
            return engine_pb2.VerifyStepResponse(step_id=request.step_id)

    async def scenario() -> None:
        servicer = VerifierServicer(RecordingExecutor(), pairings=None, model_name="m")
        second = asyncio.ensure_future(servicer.Step(engine_pb2.VerifyStepRequest(step_id=2, after_step_id=1), None))
        await asyncio.sleep(0.05)
        assert ran == []                               # waits for step 1 to be queued
        first = asyncio.ensure_future(servicer.Step(engine_pb2.VerifyStepRequest(step_id=1), None))
        await asyncio.gather(first, second)
        third = await servicer.Step(engine_pb2.VerifyStepRequest(step_id=3, after_step_id=2), None)
        assert third.step_id == 3

    asyncio.run(scenario())
    assert ran == [1, 2, 3]


def test_abandoning_drafts_is_checked_and_ends_a_waiting_step():
    import asyncio
    import threading

    import grpc

    from minedraft.data_plane import DraftPairings
    from verifier_svc.servicer import VerifierServicer

    class Aborted(Exception):
        pass

    class Context:
        async def abort(self, code, details):
            raise Aborted(code, details)

    async def scenario(backend: str, request) -> tuple:
        pairings = DraftPairings(backend, "127.0.0.1", "127.0.0.1")
        servicer = VerifierServicer(executor=None, pairings=pairings, model_name="m")
        try:
            await servicer.AbandonDrafts(request, Context())
        except Aborted as err:
            return err.args
        return None

    good = engine_pb2.AbandonDraftsRequest(drafter_id="d", draft_step_id=3)
    for bad in (engine_pb2.AbandonDraftsRequest(draft_step_id=3), engine_pb2.AbandonDraftsRequest(drafter_id="d")):
        code, details = asyncio.run(scenario("inband", bad))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "drafter_id" in details
    code, details = asyncio.run(scenario("nccl", good))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "nccl" in details
    assert asyncio.run(scenario("inband", good)) is None        # a drafter not paired: nothing to do

    pairings = DraftPairings("inband", "127.0.0.1", "127.0.0.1")
    pairings.connect("d")
    servicer = VerifierServicer(executor=None, pairings=pairings, model_name="m")
    got = []
    waiter = threading.Thread(target=lambda: got.append(pairings.recv("d", 3, 2, timeout_s=30)))
    waiter.start()
    asyncio.run(servicer.AbandonDrafts(good, Context()))
    waiter.join(5)
    assert not waiter.is_alive() and got == [None] and "d" in pairings
