"""The Batch Manager: decides what the drafter and verifier do, batch by batch.

Modes:
  ar   one batch; every step is a verify step with no drafts (k = 0).
  sd   one batch; draft it, then verify it, strictly one after the other.
  psd  two batches of up to m requests, each its own pipeline (draft, verify, draft, ...).
       While the verifier verifies batch A, the drafter drafts batch B; then they swap.
       Each call is sent the moment its inputs exist and queues at its service, so the
       verifier goes from A's verify to B's without a gateway round trip in between, and
       the drafter likewise. New requests join the batch with fewer requests and ride
       along with its next draft and verify (their prefill is just a longer first chunk),
       so no step stalls for them. When only one batch has work it runs as sequential SD,
       and overlap resumes once the other fills.

Drafters form a pool (`pool.py`): each request lives on one drafter, and a batch's draft
step runs on every drafter holding its requests, in parallel. A drafter that dies loses
nothing: its requests move to another drafter, or run at k = 0 when none is left.

The scheduler only moves token ids and counts; drafts travel drafter -> verifier on the
data plane, tagged with the drafter and its step's id.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass, field

import grpc

from gateway.pool import DrafterHandle, DrafterPool
from gateway.request import ActiveRequest
from minedraft.constants import MODES
from minedraft.protocol import new_request_proto
from minedraft.sequence import FinishReason
from minedraft.v1 import engine_pb2, engine_pb2_grpc, generation_pb2

logger = logging.getLogger("minedraft.gateway")


@dataclass
class Batch:
    index: int
    requests: list[ActiveRequest] = field(default_factory=list)
    drafted: list[tuple[ActiveRequest, int, int]] | None = None   # (request, k, source): awaiting verification
    sources: list[engine_pb2.DraftSource] = field(default_factory=list)
    has_work: asyncio.Event = field(default_factory=asyncio.Event)

    def to_draft(self) -> list[ActiveRequest]:
        return [r for r in self.requests if r.live]


@dataclass(frozen=True)
class SchedulerConfig:
    mode: str
    k: int
    max_batch: int              # m: requests per batch
    kv_blocks: int              # the verifier's KV cache, in blocks (each drafter's is checked by the pool)
    block_size: int

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.k < 0 or (self.mode != "ar" and self.k < 1):
            raise ValueError(f"k must be >= 1 for mode {self.mode!r}, got {self.k}")
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {self.max_batch}")


class BatchManager:
    def __init__(self, config: SchedulerConfig, verifier: engine_pb2_grpc.VerifierStub,
                 pool: DrafterPool | None) -> None:
        if config.mode != "ar" and pool is None:
            raise ValueError(f"mode {config.mode!r} needs a drafter pool")
        self.config = config
        self.verifier, self.pool = verifier, pool
        self.batches = [Batch(0), Batch(1)] if config.mode == "psd" else [Batch(0)]
        self.waiting: deque[ActiveRequest] = deque()
        self.requests: dict[str, ActiveRequest] = {}
        self.step_records: deque[generation_pb2.StepRecord] = deque(maxlen=100_000)
        self._free_on_verifier: list[str] = []
        self._reserved_blocks: dict[str, int] = {}
        self._background: set[asyncio.Future] = set()
        self._step_id = 0
        self._t0 = time.perf_counter()

    # ---- requests in and out -------------------------------------------------------------
    def blocks_for(self, req: ActiveRequest) -> int:
        """KV blocks a request can ever need: admission reserves them, so no step runs out."""
        tokens = len(req.seq.prompt_token_ids) + req.seq.params.max_tokens + self.config.k + 1
        return -(-tokens // self.config.block_size)

    def submit(self, req: ActiveRequest) -> None:
        if req.request_id in self.requests:
            raise KeyError(req.request_id)
        self.requests[req.request_id] = req
        self.waiting.append(req)
        self._kick()

    def cancel(self, request_id: str) -> None:
        """The client went away: stop work on the request; its tokens are not streamed."""
        req = self.requests.get(request_id)
        if req is None or req.done:
            return
        req.cancelled = True
        if req in self.waiting:
            self.waiting.remove(req)
            self._retire(req, FinishReason.ABORT)
            return
        in_flight = any(b.drafted and any(r is req for r, _, _ in b.drafted) for b in self.batches)
        if not in_flight:
            self._retire(req, FinishReason.ABORT)
        self._kick()

    def _admit(self) -> None:
        while self.waiting:
            open_batches = [b for b in self.batches if len(b.requests) < self.config.max_batch]
            if not open_batches:
                return
            req = self.waiting[0]
            need = self.blocks_for(req)
            if sum(self._reserved_blocks.values()) + need > self.config.kv_blocks:
                return
            if self.pool and self.config.mode != "ar":
                drafter = self.pool.choose(need)
                if drafter is None:         # every drafter is full: wait for one to drain
                    return
                self._assign(req, drafter)
            self.waiting.popleft()
            self._reserved_blocks[req.request_id] = need
            min(open_batches, key=lambda b: len(b.requests)).requests.append(req)

    def _assign(self, req: ActiveRequest, drafter: DrafterHandle) -> None:
        req.drafter, req.known_to_drafter, req.pending_diff = drafter, False, []
        drafter.request_ids.add(req.request_id)
        drafter.reserved_blocks += self.blocks_for(req)
        drafter.requests_assigned += 1

    def _unassign(self, req: ActiveRequest) -> None:
        drafter = req.drafter
        if drafter is None:
            return
        drafter.request_ids.discard(req.request_id)
        drafter.reserved_blocks -= self.blocks_for(req)
        if req.known_to_drafter:
            drafter.pending_frees.append(req.request_id)
        req.drafter, req.known_to_drafter, req.pending_diff = None, False, []

    def _retire(self, req: ActiveRequest, reason: FinishReason) -> None:
        """Final event to the client and KV frees queued for both services."""
        req.emit_final(reason)
        self._forget(req)

    def _forget(self, req: ActiveRequest) -> None:
        for batch in self.batches:
            if req in batch.requests:
                batch.requests.remove(req)
        if req.known_to_verifier:
            self._free_on_verifier.append(req.request_id)
        self._unassign(req)
        self._reserved_blocks.pop(req.request_id, None)
        self.requests.pop(req.request_id, None)
        if self.waiting:                # its KV reservation may let a waiting request in
            self._kick()

    # ---- the drafter pool ----------------------------------------------------------------
    async def add_drafter(self, address: str, timeout_s: float | None = None) -> None:
        await self.pool.add(address, timeout_s)
        self._kick()

    def remove_drafter(self, address: str, graceful: bool = True) -> DrafterHandle | None:
        """The drafter leaves (or died): its requests are re-homed at their next draft step.
        A graceful leave also frees their draft KV there, in case the drafter stays up."""
        drafter = self.pool.remove(address) if self.pool else None
        if drafter is None:
            return None
        for req in list(self.requests.values()):
            if req.drafter is drafter:
                self._unassign(req)
        self._background.add(asyncio.ensure_future(self._close_drafter(drafter, graceful)))
        self._background = {t for t in self._background if not t.done()}
        self._kick()
        return drafter

    async def _close_drafter(self, drafter: DrafterHandle, graceful: bool) -> None:
        if graceful and drafter.pending_frees:
            self._step_id += 1
            try:
                await drafter.stub.Step(engine_pb2.DraftStepRequest(
                    step_id=self._step_id, finished=drafter.pending_frees), timeout=5.0)
            except grpc.aio.AioRpcError:
                pass
        await drafter.channel.close()

    # ---- the batch pipelines ---------------------------------------------------------------
    async def run(self) -> None:
        """One pipeline per batch: draft, verify, draft, ... Each call goes out the moment
        its inputs exist, and the services serve calls in arrival order, so in psd the
        verifier moves from one batch's verify straight to the other's (queued while it
        worked) and the drafter likewise: neither waits for a round trip through the
        gateway while the other batch has work for it."""
        pipelines = [asyncio.ensure_future(self._pipeline(batch)) for batch in self.batches]
        try:
            await asyncio.gather(*pipelines)
        finally:
            for task in pipelines:
                task.cancel()

    def _kick(self) -> None:
        """Admit what fits and wake the pipelines that have work."""
        self._admit()
        for batch in self.batches:
            if batch.to_draft():
                batch.has_work.set()

    async def _pipeline(self, batch: Batch) -> None:
        while True:
            self._kick()
            if not batch.to_draft():
                batch.has_work.clear()
                if not any(b.to_draft() or b.drafted is not None for b in self.batches):
                    await self._flush_frees()       # nothing in flight to carry them
                await batch.has_work.wait()
                continue
            if self.config.mode == "ar":
                await self._decode(batch)
                continue
            self._step_id += 1
            step_id = self._step_id
            try:
                await self._draft(step_id, batch)
            except Exception as err:                # noqa: BLE001 - the batch fails, others go on
                self._fail_batch(batch, err)
                continue
            try:
                await self._verify(step_id, batch)
            except Exception as err:                # noqa: BLE001
                self._fail_batch(batch, err)

    async def _decode(self, batch: Batch) -> None:
        """Plain decoding keeps two steps of the batch in flight: the next is sent before the
        current one answers and runs right after it on the verifier (after_step_id), which
        owns the tokens, so it never waits for a round trip through the gateway. A request
        that finishes at step n had one more token computed at step n + 1; it is dropped."""
        in_flight: deque[asyncio.Future] = deque()
        previous = 0
        while True:
            live = batch.to_draft()
            if live and len(in_flight) < 2:
                self._step_id += 1
                items = [(r, 0, 0) for r in live]
                in_flight.append(asyncio.ensure_future(self._verify_items(self._step_id, items, [], previous)))
                previous = self._step_id
                continue
            if not in_flight:
                return
            try:
                await in_flight.popleft()
            except Exception as err:                # noqa: BLE001
                self._fail_batch(batch, err)
            self._kick()

    async def _flush_frees(self) -> None:
        """When idle, hand finished requests back to the services at once (no call to ride on)."""
        try:
            if self._free_on_verifier:
                finished, self._free_on_verifier = self._free_on_verifier, []
                self._step_id += 1
                await self.verifier.Step(engine_pb2.VerifyStepRequest(step_id=self._step_id, finished=finished))
            for drafter in list(self.pool.drafters.values()) if self.pool else []:
                if drafter.pending_frees:
                    finished, drafter.pending_frees = drafter.pending_frees, []
                    self._step_id += 1
                    await drafter.stub.Step(engine_pb2.DraftStepRequest(step_id=self._step_id, finished=finished))
        except grpc.aio.AioRpcError as err:
            logger.error("could not free finished requests: %s", err.details())

    def _record(self, kind: str, step_id: int, start: float, **fields) -> None:
        """One service call: when the gateway sent it, how long until the answer, and what
        the service reports of its own time (its compute ends just before it answers)."""
        self.step_records.append(generation_pb2.StepRecord(
            step_id=step_id, kind=kind, start_s=start - self._t0, wall_s=time.perf_counter() - start, **fields))

    async def _verify(self, step_id: int, batch: Batch) -> engine_pb2.VerifyStepResponse:
        try:
            return await self._verify_items(step_id, batch.drafted or [], batch.sources)
        finally:
            batch.drafted = None

    async def _verify_items(self, step_id: int, items: list[tuple[ActiveRequest, int, int]],
                            sources: list[engine_pb2.DraftSource],
                            after_step_id: int = 0) -> engine_pb2.VerifyStepResponse:
        new_requests = []
        for req, _, _ in items:
            if req.live and not req.known_to_verifier:
                new_requests.append(new_request_proto(req.request_id, req.seq.token_ids,
                                                      req.seq.params, req.seq.seed))
                req.known_to_verifier = True
        finished, self._free_on_verifier = self._free_on_verifier, []
        message = engine_pb2.VerifyStepRequest(
            step_id=step_id, new_requests=new_requests, finished=finished,
            items=[engine_pb2.VerifyItem(request_id=r.request_id, num_draft=k, source=source)
                   for r, k, source in items],
            sources=sources, after_step_id=after_step_id)
        start = time.perf_counter()
        response = await self.verifier.Step(message)
        self._record("verify", step_id, start, verify_busy_s=response.busy_s, data_plane_s=response.recv_s,
                     verify_batch=len(response.results))
        results = {r.request_id: r for r in response.results}
        for req, _, _ in items:
            result = results.get(req.request_id)
            if result is not None:
                self._apply(req, result.num_draft, list(result.token_ids))
            elif req.cancelled and not req.done:    # cancelled before the verifier ever saw it
                self._retire(req, FinishReason.ABORT)
        return response

    def _apply(self, req: ActiveRequest, k: int, tokens: list[int]) -> None:
        if req.cancelled and not req.done:
            self._retire(req, FinishReason.ABORT)
            return
        if not req.live:
            return
        if k:
            req.seq.stats.record(k, len(tokens) - 1)
        kept = req.seq.append(tokens)
        if req.drafter is not None:
            req.pending_diff.extend(tokens)
        req.emit_tokens(kept)
        if req.seq.is_finished:
            self._retire(req, req.seq.finish_reason)

    async def _draft(self, step_id: int, batch: Batch) -> list[engine_pb2.DraftStepResponse]:
        """Draft the batch on every drafter holding its requests, in parallel. Requests with
        no drafter (none has room, or the pool is empty) are verified with k = 0."""
        live = batch.to_draft()
        for req in live:
            if req.drafter is None and self.pool:
                drafter = self.pool.choose(self.blocks_for(req))
                if drafter is not None:
                    self._assign(req, drafter)
        by_drafter: dict[DrafterHandle, list[tuple[ActiveRequest, int]]] = {}
        drafted = []
        for req in live:
            if req.drafter is None:
                drafted.append((req, 0, 0))
            else:
                by_drafter.setdefault(req.drafter, []).append((req, req.seq.draft_length(self.config.k)))
        drafters = list(by_drafter)
        start = time.perf_counter()
        results = await asyncio.gather(*(self._draft_on(step_id, d, by_drafter[d]) for d in drafters),
                                       return_exceptions=True)
        responses, sources = [], []
        for drafter, result in zip(drafters, results):
            items = by_drafter[drafter]
            if isinstance(result, BaseException):
                self._drafter_failed(drafter, [req for req, _ in items], result)
                drafted.extend((req, 0, 0) for req, _ in items)
                continue
            # The drafter flattened its drafts in this order; the verifier reads them so.
            drafted.extend((req, k, len(sources)) for req, k in items)
            sources.append(engine_pb2.DraftSource(drafter_id=drafter.drafter_id, draft_step_id=step_id,
                                                  with_probs=result.with_probs))
            responses.append(result)
        batch.drafted, batch.sources = drafted, sources
        if responses:
            # The drafter's send waits for the verifier's matching receive, so the transfer
            # is timed on the receiving side (verify data_plane_s) only. Drafters of the
            # pool run in parallel: the call lasts as long as the slowest.
            self._record("draft", step_id, start, draft_busy_s=max(r.busy_s for r in responses),
                         draft_batch=len(drafted),
                         data_plane_bytes=sum(r.sent_bytes for r in responses))
        return responses

    async def _draft_on(self, step_id: int, drafter: DrafterHandle,
                        items: list[tuple[ActiveRequest, int]]) -> engine_pb2.DraftStepResponse:
        new_requests, updates = [], []
        for req, _ in items:
            if not req.known_to_drafter:
                new_requests.append(new_request_proto(req.request_id, req.seq.token_ids,
                                                      req.seq.params, req.seq.seed))
                req.known_to_drafter = True
            elif req.pending_diff:
                updates.append(engine_pb2.TokenDiff(request_id=req.request_id, new_token_ids=req.pending_diff))
            req.pending_diff = []
        finished, drafter.pending_frees = drafter.pending_frees, []
        return await drafter.stub.Step(engine_pb2.DraftStepRequest(
            step_id=step_id, new_requests=new_requests, updates=updates, finished=finished,
            items=[engine_pb2.DraftItem(request_id=r.request_id, num_draft=k) for r, k in items]))

    def _drafter_failed(self, drafter: DrafterHandle, requests: list[ActiveRequest], err: BaseException) -> None:
        """A draft call failed. A drafter that is gone leaves the pool; otherwise only these
        requests are re-homed (their state there is suspect). Nothing is lost either way:
        this step verifies them with k = 0."""
        code = err.code() if isinstance(err, grpc.aio.AioRpcError) else grpc.StatusCode.INTERNAL
        message = err.details() if isinstance(err, grpc.aio.AioRpcError) else repr(err)
        if code in _DRAFTER_GONE:
            logger.warning("drafter %s failed (%s: %s); re-homing its %d requests",
                           drafter.address, code.name, message, len(drafter.request_ids))
            self.remove_drafter(drafter.address, graceful=False)
            return
        logger.error("draft step on %s failed (%s: %s); re-homing %d requests",
                     drafter.address, code.name, message, len(requests))
        for req in requests:
            if req.drafter is drafter:
                self._unassign(req)

    def _fail_batch(self, batch: Batch, err: BaseException) -> None:
        """A verifier call failed: fail that batch's requests, keep serving everyone else."""
        code = err.code() if isinstance(err, grpc.aio.AioRpcError) else grpc.StatusCode.INTERNAL
        message = err.details() if isinstance(err, grpc.aio.AioRpcError) else repr(err)
        logger.error("step failed for batch %d: %s %s", batch.index, code, message)
        batch.drafted = None
        for req in list(batch.requests):
            req.emit_error(code, f"engine step failed: {message}")
            self._forget(req)


_DRAFTER_GONE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED,
                 grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL)
