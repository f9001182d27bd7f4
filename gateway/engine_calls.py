"""The Batch Manager's calls to the drafters and the verifier: builds each step's message,
makes the call and records it. Every call to another process goes through here.

Only token ids and counts travel in these messages: known requests as diffs, new ones with
their tokens; drafts go drafter -> verifier on the data plane, named by (drafter, step id).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter, deque
from collections.abc import Awaitable, Iterator
from typing import TypeVar

import grpc

from gateway.batch import DraftedItem
from gateway.cost_model import CostModel
from gateway.metrics import METRICS, PROFILE_LAYOUT
from gateway.pool import DrafterHandle
from gateway.request import ActiveRequest
from minedraft.protocol import new_request_proto
from minedraft.v1 import engine_pb2, engine_pb2_grpc, generation_pb2

STEP_RECORDS_KEPT = 100_000
MIN_WAIT_S = 0.1        # never ask a service to wait less than this (scheduling alone can take it)
SETTLED_CALLS = 16      # calls of a kind seen before its deadline leaves the start-up floor ...
DRAFT_FLOOR_S = 2.0     # ... after which a drafter's calls are never given less than this
T = TypeVar("T")


class CallCancelled(Exception):
    """A call ended by its channel closing under it (a drafter left while the call was in
    flight), not by cancelling the caller: an ordinary failed call, never a stray
    CancelledError that would end the task making it."""


def call_status(err: BaseException) -> tuple[grpc.StatusCode, str]:
    """(status code, message) of a failed call; anything but a gRPC error is INTERNAL."""
    if isinstance(err, grpc.aio.AioRpcError):
        return err.code(), err.details() or ""
    if isinstance(err, CallCancelled):
        return grpc.StatusCode.CANCELLED, str(err)
    return grpc.StatusCode.INTERNAL, repr(err)


async def guarded(call: Awaitable[T], what: str) -> T:
    """Await a call; a CancelledError that is not this task's own cancellation (grpc.aio
    raises one when the channel closes under the call) becomes CallCancelled."""
    try:
        return await call
    except asyncio.CancelledError:
        task = asyncio.current_task()
        cancelling = getattr(task, "cancelling", None)      # Python >= 3.11
        if cancelling is None or cancelling():
            raise
        raise CallCancelled(f"{what}: the call was cancelled (its channel closed)") from None


class Deadlines:
    """Deadlines of the service calls, from what they took lately and what this one should
    take: `factor` times the slowest of the last calls of that kind or times the cost
    model's prediction for this call, whichever is longer, never under `floor_s` (start-up).
    The prediction is what lets a wave of prompts through: on a slow target the verify that
    prefills 32 of them took longer than ten of the decode steps before it, and failed the
    whole batch (found serving a 256M-parameter target at concurrency 64 on two cores). A
    call that misses its deadline fails with DEADLINE_EXCEEDED: a hung drafter leaves the
    pool, a hung verifier fails its batch, and nothing waits for ever.

    A drafter's calls leave the start-up floor once SETTLED_CALLS of them were seen: their
    least deadline is then DRAFT_FLOOR_S. Missing one costs little (the drafter leaves the
    pool, its requests go on at k = 0 and it rejoins by itself), while every stream waits
    for a hung one until its deadline: with the 30 s floor a drafter frozen mid-run held all
    generation for 30 s. A verifier's calls keep the floor: missing one fails its batch."""

    def __init__(self, floor_s: float, factor: float = 10.0, window: int = 64) -> None:
        if not floor_s > 0 or not factor >= 1:
            raise ValueError(f"step timeout must be > 0 and factor >= 1, got {floor_s}, {factor}")
        self.floor_s, self.factor, self.window = floor_s, factor, window
        self._recent: dict[str, deque[float]] = {}
        self._seen: Counter[str] = Counter()

    def observe(self, kind: str, seconds: float) -> None:
        self._recent.setdefault(kind, deque(maxlen=self.window)).append(seconds)
        self._seen[kind] += 1

    def __call__(self, kind: str, predicted_s: float = 0.0) -> float:
        recent = self._recent.get(kind)
        floor = self.floor_s
        if kind == "draft" and self._seen[kind] >= SETTLED_CALLS:
            floor = min(floor, DRAFT_FLOOR_S)
        return max(floor, self.factor * max(recent or [0.0]), self.factor * predicted_s)

    def wait_s(self, kind: str, predicted_s: float = 0.0) -> float:
        """How long another service should wait for the outcome of such a call (a verify
        step for its drafts): `factor` times the slowest recent call or the prediction, no
        floor once calls have been seen; 0 (the waiter's own default) before any. A
        verify must not hold the verifier for a whole call deadline while a hung drafter
        keeps its drafts: every other batch waits behind it."""
        recent = self._recent.get(kind)
        if not recent:
            return 0.0
        return max(MIN_WAIT_S, self.factor * max(max(recent), predicted_s))


def frees_now(pending: list[str], in_flight: Counter[str]) -> tuple[list[str], list[str]]:
    """-> (the finished requests to free with the call going out now, those to keep). A
    request a call still in flight names is freed only once that call answers: two calls
    in flight may reach a service in either order, and a free that overtook the call that
    gives the service the request would leave it there for good."""
    return [r for r in pending if not in_flight[r]], [r for r in pending if in_flight[r]]


@contextlib.contextmanager
def naming(in_flight: Counter[str], request_ids: list[str]) -> Iterator[None]:
    """While a call is in flight, the requests it names are counted in `in_flight`."""
    in_flight.update(request_ids)
    try:
        yield
    finally:
        in_flight.subtract(request_ids)
        for request_id in request_ids:
            if in_flight[request_id] <= 0:
                del in_flight[request_id]


def _verifiable(req: ActiveRequest) -> bool:
    return req.live and req.known_to_verifier


class EngineCalls:
    def __init__(self, verifier: engine_pb2_grpc.VerifierStub, deadlines: Deadlines, model: CostModel) -> None:
        self.verifier = verifier
        self.deadlines = deadlines
        self.model = model          # every call's busy time is fitted; its prediction goes in the record
        self.step_records: deque[generation_pb2.StepRecord] = deque(maxlen=STEP_RECORDS_KEPT)
        self.free_on_verifier: list[str] = []      # finished requests to free there, with the next call
        self._verifier_in_flight: Counter[str] = Counter()     # request ids named by verify calls not yet answered
        self._step_id = 0
        self.clock_origin = time.perf_counter()    # the step records' clock starts here

    def next_step_id(self) -> int:
        self._step_id += 1
        return self._step_id

    def record(self, kind: str, step_id: int, start: float, waited_s: float = 0.0, **fields) -> None:
        """One service call: when the gateway sent it, how long until the answer, and what
        the service reports of its own time (its compute ends just before it answers);
        waited_s: an early verify's wait for its drafts to be drafted."""
        wall_s = time.perf_counter() - start
        self.deadlines.observe(kind, wall_s - waited_s)
        # Only sd's calls: ar keeps two steps in flight and psd's calls queue behind the other
        # batch's, so their wall time holds another call's busy time.
        if fields.get("layout") == "sd":
            self.model.observe_gateway(wall_s, fields.get("draft_busy_s", 0.0) + fields.get("verify_busy_s", 0.0)
                                       + fields.get("data_plane_s", 0.0) + waited_s)
        self.step_records.append(generation_pb2.StepRecord(
            step_id=step_id, kind=kind, start_s=start - self.clock_origin, wall_s=wall_s, **fields))
        METRICS.call_recorded({"kind": kind, "start_s": start - self.clock_origin, "wall_s": wall_s, **fields})

    async def verify(self, step_id: int, items: list[DraftedItem], sources: list[engine_pb2.DraftSource],
                     after_step_id: int = 0, layout: str = "", borrow_cpus: bool = False, observe: bool = True,
                     drafting_s: float = 0.0) -> tuple[engine_pb2.VerifyStepResponse, int]:
        """Verify `items`; requests the verifier has not seen go with their tokens. Finished
        requests ride along to be freed. after_step_id queues this step behind that one;
        borrow_cpus: nothing drafts meanwhile, the verifier may compute on the drafter's cores;
        observe: fit its busy time (not a warm-up's); drafting_s: the predicted time of the
        draft call made with this one, whose drafts it waits for (0: they were drafted before).
        -> (the answer, the prompt tokens it prefilled: the tokens of the requests new to
        the verifier)."""
        new_requests = []
        for item in items:
            req = item.request
            if req.live and not req.known_to_verifier:
                new_requests.append(new_request_proto(req.request_id, req.seq.token_ids,
                                                      req.seq.params, req.seq.seed))
                req.known_to_verifier = True
        finished, self.free_on_verifier = frees_now(self.free_on_verifier, self._verifier_in_flight)
        # A request that ended since it was drafted is named only to drop its drafts (its
        # free may ride on this very step), and not at all when it has none: the verifier
        # refuses unknown requests. The Batch Manager retires it.
        message = engine_pb2.VerifyStepRequest(
            step_id=step_id, new_requests=new_requests, finished=finished,
            items=[engine_pb2.VerifyItem(request_id=i.request.request_id, num_draft=i.num_draft, source=i.source,
                                         drop=not _verifiable(i.request))
                   for i in items if _verifiable(i.request) or i.num_draft],
            sources=sources, after_step_id=after_step_id, borrow_cpus=borrow_cpus,
            drafts_wait_s=self.deadlines.wait_s("draft", drafting_s) if drafting_s else 0.0)
        ks = [item.num_draft for item in message.items if not item.drop]
        new_tokens = sum(len(r.token_ids) for r in new_requests)
        predicted = self.model.costs().verify(ks, new_tokens, borrow_cpus)
        start = time.perf_counter()
        with naming(self._verifier_in_flight, [r.request_id for r in new_requests] + [i.request_id for i in message.items]):
            response = await guarded(self.verifier.Step(message, timeout=self.deadlines("verify", predicted + drafting_s)),
                                     "verify")
        if observe:
            self.model.observe_verify(ks, response.busy_s, new_tokens, response.borrowed,
                                      predicted=predicted if response.borrowed == borrow_cpus else None)
            if sources and any(ks):
                self.model.observe_data_plane(response.recv_s)
        self.record("verify", step_id, start, response.drafts_wait_s, verify_busy_s=response.busy_s,
                    data_plane_s=response.recv_s,
                    verify_batch=len(response.results), layout=layout, draft_lengths=ks, predicted_busy_s=predicted,
                    borrowed=response.borrowed)
        return response, new_tokens

    async def draft(self, step_id: int, drafter: DrafterHandle, items: list[tuple[ActiveRequest, int]],
                    catch_up_only: bool = False
                    ) -> tuple[engine_pb2.DraftStepResponse, float, list[tuple[ActiveRequest, int]]]:
        """Draft `items` (request, k) on one drafter: new requests go with their tokens,
        known ones with the tokens verified since it last heard (their diff). Every item is
        drafted, in this order, even one that ended meanwhile: a verify step may already be
        waiting for exactly these drafts (it drops an ended request's). catch_up_only: the
        drafter only takes the tokens in (every k is 0). -> (the answer, the busy time the
        cost model predicted, the items drafted in the order of the answer's drafts)."""
        catch_up = sum(req.drafter_catch_up for req, _ in items)
        new_requests, updates = [], []
        for req, _ in items:
            if not req.known_to_drafter:
                new_requests.append(new_request_proto(req.request_id, req.seq.token_ids,
                                                      req.seq.params, req.seq.seed))
                req.known_to_drafter = True
            elif req.pending_diff:
                updates.append(engine_pb2.TokenDiff(request_id=req.request_id, new_token_ids=req.pending_diff))
            req.pending_diff = []
        finished, drafter.pending_frees = frees_now(drafter.pending_frees, drafter.in_flight)
        ks = [k for _, k in items]
        predicted = self.model.costs().draft(ks, catch_up)
        with naming(drafter.in_flight, [r.request_id for r, _ in items]):
            response = await guarded(drafter.stub.Step(engine_pb2.DraftStepRequest(
                step_id=step_id, new_requests=new_requests, updates=updates, finished=finished, catch_up=catch_up_only,
                items=[engine_pb2.DraftItem(request_id=r.request_id, num_draft=k) for r, k in items]),
                timeout=self.deadlines("draft", predicted)), f"draft on {drafter.address}")
        self.model.observe_draft(ks, response.busy_s, catch_up, predicted=predicted)
        return response, predicted, items

    async def catch_up(self, step_id: int, drafter: DrafterHandle, requests: list[ActiveRequest], layout: str) -> None:
        """The drafter takes in every token of `requests` verified since it last heard of
        them, and drafts nothing (auto mode, on its way from plain decoding to drafting)."""
        start = time.perf_counter()
        response, predicted, _ = await self.draft(step_id, drafter, [(r, 0) for r in requests], catch_up_only=True)
        self.record("draft", step_id, start, draft_busy_s=response.busy_s, draft_batch=len(requests), layout=layout,
                    draft_lengths=[0] * len(requests), predicted_busy_s=predicted)

    def predict_draft(self, by_drafter: dict[DrafterHandle, list[tuple[ActiveRequest, int]]]) -> float:
        """The cost model's busy time of a batch's draft step: its slowest drafter's."""
        costs = self.model.costs()
        return max((costs.draft([k for _, k in items], sum(req.drafter_catch_up for req, _ in items))
                    for items in by_drafter.values()), default=0.0)

    async def abandon_drafts(self, drafter_id: str, step_id: int) -> None:
        """Tell the verifier that this drafter step's drafts will not come: a verify step
        sent with the draft call goes on without them instead of waiting."""
        await guarded(self.verifier.AbandonDrafts(
            engine_pb2.AbandonDraftsRequest(drafter_id=drafter_id, draft_step_id=step_id),
            timeout=self.deadlines.floor_s), "abandon drafts")

    async def draft_all(self, step_id: int, by_drafter: dict[DrafterHandle, list[tuple[ActiveRequest, int]]],
                        num_items: int, layout: str = ""
                        ) -> list[tuple[DrafterHandle, engine_pb2.DraftStepResponse | BaseException,
                                        list[tuple[ActiveRequest, int]]]]:
        """One batch's draft step on each of its drafters, in parallel; -> (drafter, response
        or the call's exception, the items it drafted: all of them when the call failed). One
        record for the step: it lasts as long as the slowest drafter. The drafter's send waits
        for the verifier's matching receive, so the transfer is timed on the receiving side
        (verify data_plane_s) only."""
        drafters = list(by_drafter)
        start = time.perf_counter()
        results = await asyncio.gather(*(self.draft(step_id, d, by_drafter[d]) for d in drafters),
                                       return_exceptions=True)
        answered = [r for r in results if not isinstance(r, BaseException)]
        predicted = max((p for _, p, _ in answered), default=0.0)
        for drafter, result in zip(drafters, results):
            if layout != PROFILE_LAYOUT and not isinstance(result, BaseException):
                drafter.compute_s += result[0].busy_s
        if answered:
            self.record("draft", step_id, start, draft_busy_s=max(r.busy_s for r, _, _ in answered),
                        draft_batch=num_items, data_plane_bytes=sum(r.sent_bytes for r, _, _ in answered),
                        layout=layout, draft_lengths=[k for _, _, sent in answered for _, k in sent],
                        predicted_busy_s=predicted)
        return [(d, r, by_drafter[d]) if isinstance(r, BaseException) else (d, r[0], r[2])
                for d, r in zip(drafters, results)]

    async def flush_verifier_frees(self) -> None:
        """Free finished requests on the verifier now (when no step is there to carry them)."""
        finished, self.free_on_verifier = frees_now(self.free_on_verifier, self._verifier_in_flight)
        if finished:
            await guarded(self.verifier.Step(engine_pb2.VerifyStepRequest(step_id=self.next_step_id(),
                                                                          finished=finished),
                                             timeout=self.deadlines.floor_s), "free on the verifier")

    async def flush_drafter_frees(self, drafter: DrafterHandle, timeout_s: float | None = None,
                                  dismiss: bool = False) -> None:
        """Free finished requests' draft KV on one drafter now; dismiss: and tell it that it
        left the pool for good (an operator deregistered it)."""
        finished, drafter.pending_frees = frees_now(drafter.pending_frees, drafter.in_flight)
        if finished or dismiss:
            await guarded(drafter.stub.Step(
                engine_pb2.DraftStepRequest(step_id=self.next_step_id(), finished=finished, dismiss=dismiss),
                timeout=timeout_s or self.deadlines("draft")), f"free on {drafter.address}")
