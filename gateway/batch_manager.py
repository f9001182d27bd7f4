"""The Batch Manager: decides what the drafter and verifier do, batch by batch.

Modes:
  auto picks one of the layouts below, and each request's draft length, at every step from
       the costs it measures (gateway/auto.py); requests move between the batches only at
       their batch's step boundary, when nothing of theirs is in flight.
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

Admission and the KV ledger live in `admission.py`, the calls to the services in
`engine_calls.py`, the batch and the config in `batch.py`, how a failed call is read in
`failures.py`; this file holds the pipelines and the requests' way in and out.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import deque

import grpc

from gateway.admission import Admission
from gateway.auto import AutoPlanner
from gateway.batch import Batch, BatchManagerConfig, DraftedItem, Overloaded
from gateway.cost_model import LENT_WINDOW
from gateway.engine_calls import Deadlines, EngineCalls, call_status
from gateway.failures import drafter_gone, verify_failure
from gateway.metrics import METRICS
from gateway.pool import DrafterHandle, DrafterPool
from gateway.profile import profile
from gateway.request import ActiveRequest
from minedraft.metrics import AcceptanceStats
from minedraft.sequence import FinishReason
from minedraft.v1 import engine_pb2, engine_pb2_grpc, generation_pb2

logger = logging.getLogger("minedraft.gateway")
LEAVE_FREE_TIMEOUT_S = 5.0      # a drafter leaving gracefully gets this long to free its requests
PROFILE_DRAFTER_WAIT_S = 10.0   # auto mode's start-up profile waits this long for a first drafter
LEND_FIRST_RECHECK_S = 2.0      # lent cores measured to slow plain decoding are tried again after this,
                                # then after four times as long each time they are still slower, up to
LEND_RECHECK_S = 30.0           # this (a reading made during a moment's contention costs seconds, not
                                # half a minute on one core); and
OWN_WINDOW = 8                  # while lending pays, this many plain steps run on the own cores as often
                                # (every LEND_RECHECK_S of plain decoding on the lent cores, idle time
                                # not counted), so lending is judged beside steps of today's requests
PLAIN_GAP_S = 1.0               # lent plain steps further apart than this were not one spell of decoding


def _expected_tokens(req: ActiveRequest, k: int) -> float | None:
    """What a step drafting k for the request is expected to give: 1 + its drafts' reach by
    the acceptance auto chose k by (None where none was: fixed modes)."""
    return 1.0 + sum(req.draft_reach[:k]) if len(req.draft_reach) >= k else None


def _step_expected(items: list[DraftedItem], results: dict[str, engine_pb2.VerifyResult]) -> float:
    """The tokens a step's requests were expected to receive: each verified as drafted its
    expectation, any other (plain, or verified without its drafts) the tokens it received."""
    expected = 0.0
    for item in items:
        result = results.get(item.request.request_id)
        if result is None:
            continue
        fits = item.expected_tokens is not None and result.num_draft == item.num_draft
        expected += item.expected_tokens if fits else len(result.token_ids)
    return expected


class BatchManager:
    def __init__(self, config: BatchManagerConfig, verifier: engine_pb2_grpc.VerifierStub,
                 pool: DrafterPool | None) -> None:
        if config.mode != "ar" and pool is None:
            raise ValueError(f"mode {config.mode!r} needs a drafter pool")
        self.config = config
        self.pool = pool
        self.admission = Admission(config.kv_blocks, config.block_size, config.k, pool)
        # Measures costs and acceptance in every mode; plans only in auto.
        self.planner = AutoPlanner(config.k, cycle_steps=config.auto_cycle_steps)
        self.calls = EngineCalls(verifier, Deadlines(config.step_timeout_s), self.planner.model)
        # NCCL receives a step's drafts inside the step, in issue order: a verify waiting for
        # drafts whose call failed could not be told to go on without them.
        self.early_verify = config.early_verify and pool is not None and pool.target.data_plane != "nccl"
        self.planner.model.early_verify = self.early_verify
        self.planner.clock_origin = self.calls.clock_origin     # decisions and steps on one clock
        self.unavailable: str | None = None     # why new requests are refused (None: they are not)
        self.batches = [Batch(0), Batch(1)] if config.mode in ("psd", "auto") else [Batch(0)]
        self._drafting = 0                      # draft calls in flight (the drafter's cores are busy)
        self._catching_up = 0                   # ... of which catch-ups (see _catch_up)
        self._lend_trial_left = 0               # plain steps still to borrow in a re-check of lending ...
        self._own_left = 0                      # ... or to run on the own cores in one of lending that pays
        self._lent_decoding_s = 0.0             # plain decoding on the lent cores since the last own-core window
        self._lent_step_at = float("-inf")      # ... and when its latest step went out
        self._own_window_for: float | None = None   # the doubt about lending an own-core window was run for
        self._lend_recheck_s = LEND_FIRST_RECHECK_S     # the wait before lending measured slower is re-checked
        self.requests: dict[str, ActiveRequest] = {}
        self._background: set[asyncio.Future] = set()
        METRICS.watch(self)                     # its queues, KV, pool and layout, read when scraped

    @property
    def step_records(self) -> deque:
        return self.calls.step_records

    @property
    def auto(self) -> bool:
        return self.config.mode == "auto"

    @property
    def layout(self) -> str:
        """How the batches run now: the mode, or in auto mode the plan's layout."""
        return self.planner.plan.layout if self.auto else self.config.mode

    # ---- requests in and out -------------------------------------------------------------
    def submit(self, req: ActiveRequest) -> None:
        """Queue a request; raises Overloaded when the queue is full, KeyError for a
        request id already running."""
        if req.request_id in self.requests:
            raise KeyError(req.request_id)
        if len(self.admission.waiting) >= self.config.max_waiting:
            raise Overloaded(f"the queue is full ({len(self.admission.waiting)} requests waiting); retry later")
        self.requests[req.request_id] = req
        self.admission.waiting.append(req)
        self._kick()

    def cancel(self, request_id: str) -> None:
        """The client went away: stop work on the request; its tokens are not streamed."""
        req = self.requests.get(request_id)
        if req is None or req.done:
            return
        req.cancelled = True
        if not any(batch.in_flight(req) for batch in self.batches):
            self._retire(req, FinishReason.ABORT)
        self._kick()

    def _admit(self) -> None:
        # With no drafter at all, requests run at k = 0 rather than wait for one to join.
        place_on_drafter = self.config.mode != "ar" and self.pool is not None and len(self.pool) > 0
        while True:
            batch = self._batch_for_new_request()
            if batch is None:
                return
            req = self.admission.admit_next(place_on_drafter)
            if req is None:
                return
            batch.requests.append(req)
            # Counted as they arrive, not when prefilled: a burst weighs on the plan made for it.
            self.planner.model.observe_admitted(req.request_id, len(req.seq.token_ids), req.seq.params.max_tokens)

    def _batch_for_new_request(self) -> Batch | None:
        """The batch with the fewest requests that has room. In auto mode max_batch bounds
        the requests running at once, and only psd fills the second batch."""
        if self.auto:
            if sum(len(b.requests) for b in self.batches) >= self.config.max_batch:
                return None
            # (Not while the drafters catch up: the second batch's first step would hold the
            # verifier, waiting on its drafts, until they have.)
            open_batches = self.batches if self.layout == "psd" and not self._catching_up else self.batches[:1]
        else:
            open_batches = [b for b in self.batches if len(b.requests) < self.config.max_batch]
        return min(open_batches, key=lambda b: len(b.requests)) if open_batches else None

    def _rebalance(self, batch: Batch) -> None:
        """At `batch`'s step boundary (none of its requests in flight), hand requests to the
        other batch as the layout wants: all of the second batch's to the first outside psd,
        half the difference in psd. The receiving batch takes them at its next step."""
        if not self.auto:
            return
        other = self.batches[1 - batch.index]
        if self.layout != "psd":
            moving = list(batch.requests) if batch.index == 1 else []
        else:
            moving = batch.requests[len(batch.requests) - (len(batch.requests) - len(other.requests)) // 2:]
        if moving:
            del batch.requests[len(batch.requests) - len(moving):]
            other.requests.extend(moving)
            other.has_work.set()

    def _retire(self, req: ActiveRequest, reason: FinishReason) -> None:
        """Final event to the client and KV frees queued for both services."""
        if reason != FinishReason.ABORT:
            self.planner.model.observe_finished(req.request_id, len(req.seq.output_token_ids))
        req.emit_final(reason)
        self._forget(req)

    def _forget(self, req: ActiveRequest) -> None:
        for batch in self.batches:
            if req in batch.requests:
                batch.requests.remove(req)
        if req.known_to_verifier:
            self.calls.free_on_verifier.append(req.request_id)
        self.admission.release(req)
        self.requests.pop(req.request_id, None)
        if self.admission.waiting:          # its KV reservation may let a waiting request in
            self._kick()

    def fail_all(self, code: grpc.StatusCode, message: str) -> None:
        """Every request ends with this error (the verifier was lost: their state with it)."""
        for batch in self.batches:
            batch.drafted = None
            self._fail(list(batch.requests), code, message)
        self._fail(list(self.requests.values()), code, message)     # those still waiting

    def _fail(self, requests: list[ActiveRequest], code: grpc.StatusCode, message: str) -> None:
        for req in requests:
            req.emit_error(code, message)
            self._forget(req)

    def describe(self) -> tuple[generation_pb2.CostModel, generation_pb2.AutoPlan | None]:
        """(the cost model, the plan in force in auto mode or None) for GetServerInfo."""
        return self.planner.describe(planning=self.auto)

    @property
    def steps_in_flight(self) -> bool:
        return any(b.drafted is not None for b in self.batches)

    # ---- the drafter pool ----------------------------------------------------------------
    async def add_drafter(self, address: str, timeout_s: float | None = None) -> None:
        await self.pool.add(address, timeout_s)
        self._kick()

    def remove_drafter(self, address: str, graceful: bool = True) -> DrafterHandle | None:
        """The drafter leaves (or died): its requests are re-homed at their next draft step.
        A graceful leave (deregistered) also frees their draft KV there, in case the drafter
        stays up, and dismisses it: it does not rejoin by itself. One that failed rejoins."""
        drafter = self.pool.remove(address) if self.pool else None
        if drafter is None:
            return None
        for req in list(self.requests.values()):
            if req.drafter is drafter:
                self.admission.unassign(req)
        self._background.add(asyncio.ensure_future(self._close_drafter(drafter, graceful)))
        self._background = {t for t in self._background if not t.done()}
        self._kick()
        return drafter

    async def _close_drafter(self, drafter: DrafterHandle, graceful: bool) -> None:
        try:
            if graceful:
                await self.calls.flush_drafter_frees(drafter, LEAVE_FREE_TIMEOUT_S, dismiss=True)
        except Exception as err:                # noqa: BLE001 - it is leaving anyway
            logger.info("drafter %s left before its requests were freed: %s", drafter.address, err)
        finally:
            await drafter.channel.close()

    # ---- the batch pipelines ---------------------------------------------------------------
    async def run(self) -> None:
        """One pipeline per batch: draft, verify, draft, ... Each call goes out the moment
        its inputs exist, and the services serve calls in arrival order, so in psd the
        verifier moves from one batch's verify straight to the other's (queued while it
        worked) and the drafter likewise: neither waits for a round trip through the
        gateway while the other batch has work for it."""
        if self.auto:
            await self._wait_for_drafter(PROFILE_DRAFTER_WAIT_S)
            drafter = next(iter(self.pool.drafters.values()), None) if self.pool else None
            await profile(self.calls, drafter, self.config.max_batch, self.config.k)
            await self.flush_frees()
        pipelines = [asyncio.ensure_future(self._pipeline(batch)) for batch in self.batches]
        try:
            await asyncio.gather(*pipelines)
        finally:
            for task in pipelines:
                task.cancel()

    async def _wait_for_drafter(self, timeout_s: float) -> None:
        """Drafters register themselves once the gateway is up: give the first a moment, so
        the profile measures drafting too (requests arriving meanwhile wait in the queue).
        Drafters that join later are measured by their first calls."""
        deadline = time.monotonic() + timeout_s
        while self.pool is not None and not len(self.pool) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    def _kick(self) -> None:
        """Admit what fits and wake the pipelines that have work."""
        self._admit()
        for batch in self.batches:
            if batch.to_draft():
                batch.has_work.set()

    async def _pipeline(self, batch: Batch) -> None:
        while True:
            self._kick()
            # Plan first, then split: a burst that came in under a one-batch plan is halved
            # at this boundary if the new plan is psd (split only at the next one, a burst of
            # 32 prompts prefilled as one batch took 2 s on the reference machine, against
            # 1.1 s as two overlapped halves).
            self._maybe_replan()
            self._rebalance(batch)
            if not batch.to_draft():
                batch.has_work.clear()
                if not any(b.to_draft() or b.drafted is not None for b in self.batches):
                    self.planner.idle()
                    await self.flush_frees()        # nothing in flight to carry them
                await batch.has_work.wait()
                continue
            if self.layout == "ar":
                if batch.index == 0:
                    await self._decode(batch)
                continue                            # the second batch hands its requests over
            step_id = self.calls.next_step_id()
            try:
                await self._step(step_id, batch)
            except Exception as err:                # noqa: BLE001 - the batch fails, others go on
                self._fail_batch(batch, err)
            finally:
                self._end_step(batch)

    def _maybe_replan(self) -> None:
        if not self.auto:
            return
        running = [r for b in self.batches for r in b.to_draft()]
        if running and self.planner.replan_due(len(running)):
            self.planner.replan(running, self._k_cap())

    def _k_cap(self) -> int:
        """The longest draft possible now: none while no drafter is in the pool."""
        return self.config.k if self.pool is not None and len(self.pool) > 0 else 0

    def _draft_length(self, req: ActiveRequest) -> int:
        if self.auto:
            k = self.planner.draft_length(req, self._k_cap())
        else:
            k = req.draft_cap(self.config.k)
        return req.seq.draft_length(k)

    async def _decode(self, batch: Batch) -> None:
        """Plain decoding keeps two steps of the batch in flight: the next is sent before the
        current one answers and runs right after it on the verifier (after_step_id), which
        owns the tokens, so it never waits for a round trip through the gateway. A request
        that finishes at step n had one more token computed at step n + 1; it is dropped.
        gRPC does not order the answers of concurrent calls: step n + 1's may come back
        first, and is applied only after step n's (a bench run once streamed two tokens
        swapped).
        When the plan moves on to a drafting layout, the drafters first take in what was
        verified without them (see _catch_up) while plain decoding goes on, on the
        verifier's own cores; the batch is handed back to the pipeline once they have."""
        in_flight: deque[tuple[asyncio.Future, bool]] = deque()     # (step, whether it borrowed)
        previous = 0
        catching_up: asyncio.Future | None = None
        caught_up_from = 0              # the tokens the latest catch-up took in (0: none since plain decoding)
        while True:
            live = batch.to_draft()
            if catching_up is not None and catching_up.done():
                catching_up = None
            if self.layout == "ar":
                caught_up_from = 0
            # On the way to drafting: plain steps go on (on the own cores) until the drafters
            # have caught up, and the catch-up starts once no step is on the drafter's cores.
            # What was verified meanwhile is caught up again while that pays and is at most
            # half as much (else the first drafting step takes it in).
            switching = catching_up is not None
            if not switching and self.layout != "ar" and live:
                drafting = self._placed_to_draft(live)
                tokens = sum(req.drafter_catch_up for req in drafting)
                switching = self._catch_up_pays(tokens, len(live)) and (not caught_up_from or 2 * tokens <= caught_up_from)
                if switching and not any(lent for _, lent in in_flight):
                    catching_up, caught_up_from = self._catch_up(drafting), tokens
            if live and len(in_flight) < 2 and (self.layout == "ar" or switching):
                step_id = self.calls.next_step_id()
                items = [DraftedItem(r, 0) for r in live]
                # Nothing drafts now (the other batch is empty in this layout): the verifier
                # may compute on the drafter's cores too.
                borrow = (self.auto and self.layout == "ar" and not self._drafting
                          and not any(b.requests for b in self.batches[1:])
                          and self._lend(prefills=any(not r.known_to_verifier for r in live)))
                in_flight.append((asyncio.ensure_future(
                    self._verify_items(step_id, items, [], previous, borrow_cpus=borrow,
                                       apply_after=in_flight[-1][0] if in_flight else None, plain=True)), borrow))
                previous = step_id
                continue
            if not in_flight:
                return                              # the layout changed: back to the pipeline
            try:
                await in_flight.popleft()[0]
            except Exception as err:                # noqa: BLE001
                self._fail_batch(batch, err)
            self._kick()
            self._maybe_replan()

    def _placed_to_draft(self, live: list[ActiveRequest]) -> list[ActiveRequest]:
        """The requests that will draft, each on a drafter: those without one are placed
        first, as their first drafting step would; those with none to go to, or with
        speculation off, are left out."""
        drafting = []
        for req in live:
            if req.max_draft != 0 and req.drafter is None:
                self.admission.place(req)
            if req.max_draft != 0 and req.drafter is not None:
                drafting.append(req)
        return drafting

    def _catch_up_pays(self, tokens: int, batch: int) -> bool:
        """StepCosts.catch_up_pays; in tests that cycle the layouts, whenever there is more
        than a token a request to catch up."""
        if self.config.auto_cycle_steps:
            return tokens > batch
        return self.planner.costs().catch_up_pays(tokens, batch)

    def _catch_up(self, drafting: list[ActiveRequest]) -> asyncio.Future:
        """Each drafter takes in what was verified for its requests since it last drafted,
        on a call of its own that drafts nothing, while the verifier goes on decoding on its
        own cores: the switch to drafting costs a few plain steps on them, not the verifier
        idle for the whole catch-up. A drafter that fails is handled as in a failed draft
        call: its requests draft elsewhere, or catch up in their first drafting step."""
        by_drafter: dict[DrafterHandle, list[ActiveRequest]] = {}
        for req in drafting:                                    # (each on a drafter: _placed_to_draft)
            by_drafter.setdefault(req.drafter, []).append(req)
        layout = self.layout

        async def one(drafter: DrafterHandle, requests: list[ActiveRequest]) -> None:
            # Only those still live and on this drafter as the call goes out: one that ended
            # since it was counted was taken off the drafter then, so the call would give it
            # a request nobody frees (no verify waits on a catch-up, so none needs naming).
            requests = [req for req in requests if req.live and req.drafter is drafter]
            if not requests:
                return
            try:
                await self.calls.catch_up(self.calls.next_step_id(), drafter, requests, layout)
            except Exception as err:            # noqa: BLE001 - as a failed draft call
                code, message = call_status(err)
                logger.warning("drafter %s did not catch up (%s: %s)", drafter.address, code.name, message)
                self._drafter_failed(drafter, requests, err)

        def done(task: asyncio.Future) -> None:
            self._drafting -= 1
            self._catching_up -= 1
            if not task.cancelled() and task.exception() is not None:      # (a bug of ours: said)
                logger.error("the drafters' catch-up failed", exc_info=task.exception())
            self._kick()
            # Frees held back while this call named their requests go now: an idle pipeline
            # flushes them (it may have gone idle while the catch-up was still out).
            self.batches[0].has_work.set()

        # Counted from now, not from when the task first runs: no step borrows the drafter's
        # cores meanwhile.
        self._drafting += 1
        self._catching_up += 1
        task = asyncio.ensure_future(asyncio.gather(*(one(drafter, requests) for drafter, requests in by_drafter.items())))
        task.add_done_callback(done)
        self._background.add(task)
        self._background = {t for t in self._background if not t.done()}
        return task

    def _lend(self, prefills: bool = False) -> bool:
        """Whether this plain step borrows the drafter's cores: while that was measured to pay
        (or never measured), and for a window of steps now and then otherwise, so a
        change of load or machine is noticed (docs/auto.md, "Same hardware, all of it").
        prefills: the step carries prompts of requests new to the verifier. While lending
        pays such a step always borrows, and an own-core window waits for the next step
        that only decodes: lending is judged beside plain decode steps only, and a window
        that took a closed loop's wave of 64 prompts prefilled it on one core (1.4 s against
        0.7 s lent, 6% of that bench run).
        While it pays, OWN_WINDOW steps run on the own cores every LEND_RECHECK_S of lent plain
        decoding: lending is judged only beside own-core steps that ran near the lent ones
        (CostModel._judge_lending). Counted in decoding time, not wall time: a server that
        serves in bursts would otherwise pay a window in most bursts (at C = 64, 3-4% of the
        steps of a bench run on one core, each near twice as long).
        A first reading of lending as slower is a doubt (CostModel._judge_lending): a window
        of own-core steps runs at once, and the lent steps after it confirm or clear it.
        Measured slower, lending is re-checked LEND_FIRST_RECHECK_S after its last lent step,
        then ever less often (up to every LEND_RECHECK_S) while it stays slower."""
        model = self.planner.model
        if model.lending_pays:
            self._lend_recheck_s = LEND_FIRST_RECHECK_S
            now = time.monotonic()
            if now - self._lent_step_at <= PLAIN_GAP_S:
                self._lent_decoding_s += now - self._lent_step_at
            self._lent_step_at = now
            doubt = model.lending_doubted_at
            due = self._lent_decoding_s >= LEND_RECHECK_S or (doubt is not None and doubt != self._own_window_for)
            if self._own_left <= 0 and due:
                self._own_left, self._own_window_for, self._lent_decoding_s = OWN_WINDOW, doubt, 0.0
            if self._own_left > 0 and not prefills:
                self._own_left -= 1
                return False
            return True
        if self._lend_trial_left <= 0:
            if time.monotonic() - model.lent_observed_at < self._lend_recheck_s:
                return False
            self._lend_trial_left = LENT_WINDOW
            self._lend_recheck_s = min(LEND_RECHECK_S, 4 * self._lend_recheck_s)
        self._lend_trial_left -= 1
        return True

    async def flush_frees(self) -> None:
        """When idle, hand finished requests back to the services at once (no call to ride on).
        A service that does not answer loses nothing that matters: a drafter that failed is
        dropped by its next draft call, and a verifier that failed has lost its state."""
        calls = [("the verifier", self.calls.flush_verifier_frees)]
        calls += [(d.address, functools.partial(self.calls.flush_drafter_frees, d))
                  for d in (list(self.pool.drafters.values()) if self.pool else [])]
        for name, call in calls:
            try:
                await call()
            except Exception as err:            # noqa: BLE001 - logged; the pipeline goes on
                code, message = call_status(err)
                logger.warning("could not free finished requests on %s (%s: %s)", name, code.name, message)

    async def _verify_items(self, step_id: int, items: list[DraftedItem], sources: list[engine_pb2.DraftSource],
                            after_step_id: int = 0, borrow_cpus: bool = False, drafting_s: float = 0.0,
                            caught_up: bool = True, apply_after: asyncio.Future | None = None,
                            plain: bool = False) -> None:
        """apply_after: the step this one was queued behind, whose tokens come first; plain:
        a plain decoding step (one while the drafters catch up too, whatever the plan)."""
        layout = "ar" if plain else self._step_layout()
        response, prompt_tokens = await self.calls.verify(step_id, items, sources, after_step_id, layout, borrow_cpus,
                                                          drafting_s=drafting_s)
        if apply_after is not None and not apply_after.done():
            await asyncio.wait([apply_after])       # (its failure is its own task's to report)
        # A step counts towards a switch settling only once every request is where the
        # layout wants it (after psd, the second batch's last step hands its requests over)
        # and the drafters have caught up with what was verified without them.
        settled = caught_up and self._in_shape()
        results = {r.request_id: r for r in response.results}
        self.planner.observe_step(layout if settled else "", sum(len(r.token_ids) for r in response.results),
                                  prompt_tokens, batch=len(response.results), expected=_step_expected(items, results))
        accepted = AcceptanceStats()                # this step's, for the metrics
        for item in items:
            req, result = item.request, results.get(item.request.request_id)
            if result is not None:
                self._apply(req, result.num_draft, list(result.token_ids), accepted)
            elif req.cancelled and not req.done:    # cancelled since it was drafted
                self._retire(req, FinishReason.ABORT)
        METRICS.step_accepted(accepted)

    def _in_shape(self) -> bool:
        """The batches are as the layout wants them: both holding requests in psd, the
        second empty otherwise, and in plain decoding no draft still running (until then the
        verifier cannot borrow the drafter's cores)."""
        if self.layout == "ar" and self._drafting:
            return False
        if len(self.batches) < 2:
            return True
        return all(b.requests for b in self.batches) if self.layout == "psd" else not self.batches[1].requests

    def _step_layout(self) -> str:
        """The layout a step runs in: psd with one batch empty is sequential SD."""
        if self.layout == "psd" and sum(1 for b in self.batches if b.requests) < 2:
            return "sd"
        return self.layout

    def _apply(self, req: ActiveRequest, k: int, tokens: list[int], step: AcceptanceStats) -> None:
        if req.cancelled and not req.done:
            self._retire(req, FinishReason.ABORT)
            return
        if not req.live:
            return
        if k:
            self.planner.acceptance.record(req.seq.stats, k, len(tokens) - 1)
            step.record(k, len(tokens) - 1)
        kept = req.seq.append(tokens)
        if req.drafter is not None:
            req.pending_diff.extend(tokens)
        req.emit_tokens(kept)
        if req.seq.is_finished:
            self._retire(req, req.seq.finish_reason)

    def _assign_drafts(self, step_id: int, batch: Batch
                       ) -> tuple[list[DraftedItem], dict[DrafterHandle, list[tuple[ActiveRequest, int]]]]:
        """Each live request's draft length and drafter this step; the batch's verify items
        and sources to match. Requests with no drafter (none has room, or the pool is empty)
        are verified with k = 0."""
        by_drafter: dict[DrafterHandle, list[tuple[ActiveRequest, int]]] = {}
        drafted: list[DraftedItem] = []
        for req in batch.to_draft():
            k = self._draft_length(req)
            if k and req.drafter is None:
                self.admission.place(req)
            if not k or req.drafter is None:
                drafted.append(DraftedItem(req, 0))
            else:
                by_drafter.setdefault(req.drafter, []).append((req, k))
        # Each drafter flattens its drafts in the order of its items; the verifier reads them so.
        batch.sources = []
        for source, (drafter, items) in enumerate(by_drafter.items()):
            drafted.extend(DraftedItem(req, k, source, _expected_tokens(req, k)) for req, k in items)
            batch.sources.append(engine_pb2.DraftSource(drafter_id=drafter.drafter_id, draft_step_id=step_id))
        batch.drafted = drafted
        return drafted, by_drafter

    async def _step(self, step_id: int, batch: Batch) -> None:
        """Draft the batch on every drafter holding its requests, in parallel, and verify it.
        The verify goes out with the draft calls (early verify): it waits at the verifier
        for the drafts, which come on the data plane, so the step costs no gateway round trip
        between drafting and verifying. A draft call that fails is abandoned at the verifier
        (those requests verify with k = 0 there). Without early verify (--no-early-verify,
        or NCCL, which cannot abandon), the verify goes once the drafts are in, with k = 0
        for the requests of a failed drafter. Nothing is lost either way."""
        drafted, by_drafter = self._assign_drafts(step_id, batch)
        sources, layout = batch.sources, self._step_layout()
        caught_up = self._drafters_caught_up(by_drafter)      # (the draft call takes their tokens)
        verify = None
        if by_drafter and self.early_verify:
            verify = asyncio.ensure_future(self._verify_items(step_id, drafted, sources, caught_up=caught_up,
                                                              drafting_s=self.calls.predict_draft(by_drafter)))
        try:
            self._drafting += 1
            try:
                answers = await self.calls.draft_all(step_id, by_drafter, len(drafted), layout) if by_drafter else []
            finally:
                self._drafting -= 1
            failed = set()
            for drafter, result, sent in answers:
                if isinstance(result, BaseException):
                    failed.add(drafter.drafter_id)
                    self._drafter_failed(drafter, [req for req, _ in sent], result)
            if verify is not None:
                await self._abandon(step_id, sorted(failed))
                await verify
                return
        except BaseException:
            if verify is not None and not verify.done():
                verify.cancel()
            raise
        if failed:
            batch.sources = [s for s in sources if s.drafter_id not in failed]
            index = {s.drafter_id: i for i, s in enumerate(batch.sources)}
            batch.drafted = drafted = [
                item if not item.num_draft
                else DraftedItem(item.request, 0) if sources[item.source].drafter_id in failed
                else DraftedItem(item.request, item.num_draft, index[sources[item.source].drafter_id])
                for item in drafted]
        await self._verify_items(step_id, drafted, batch.sources, caught_up=caught_up)

    def _drafters_caught_up(self, by_drafter: dict[DrafterHandle, list[tuple[ActiveRequest, int]]]) -> bool:
        """Whether the drafters already hold every drafting request's tokens but for what one
        step verified. Not so in the first steps after plain decoding: the drafter first takes
        in every token verified meanwhile (at C = 64 on the reference machine a first psd
        step of 0.4-0.7 s against 0.07 s steady), and such steps say nothing of how the
        layout runs. A new request's prompt is prefill, which is priced apart."""
        one_step = self.config.k + 1
        return all((req.drafter_catch_up if req.known_to_drafter else len(req.seq.output_token_ids)) <= one_step
                   for items in by_drafter.values() for req, _ in items)

    def _end_step(self, batch: Batch) -> None:
        """The batch's step is over: a request cancelled while it was in flight but after
        its verify's results were applied (an early verify may answer before the draft
        call does) ends now."""
        drafted, batch.drafted = batch.drafted, None
        for item in drafted or []:
            if item.request.cancelled and not item.request.done:
                self._retire(item.request, FinishReason.ABORT)

    async def _abandon(self, step_id: int, drafter_ids: list[str]) -> None:
        """The verify waiting for these drafters' drafts of this step goes on without them.
        Should the verifier not hear of it, the verify waits out its drafts_wait_s instead.
        One call per drafter, all at once: the verify waits for the last of them."""
        results = await asyncio.gather(*(self.calls.abandon_drafts(drafter_id, step_id) for drafter_id in drafter_ids),
                                       return_exceptions=True)
        for drafter_id, result in zip(drafter_ids, results):
            if isinstance(result, Exception):   # logged; the verify times the wait out
                code, message = call_status(result)
                logger.warning("could not abandon the drafts of step %d from drafter %s (%s: %s)",
                               step_id, drafter_id, code.name, message)
            elif isinstance(result, BaseException):
                raise result

    # ---- failures ---------------------------------------------------------------------------
    def _drafter_failed(self, drafter: DrafterHandle, requests: list[ActiveRequest], err: BaseException) -> None:
        """A draft call failed. A drafter that is gone leaves the pool; otherwise only these
        requests are re-homed (their state there is suspect). Nothing is lost either way:
        this step verifies them with k = 0."""
        if drafter_gone(drafter, requests, err):
            self.remove_drafter(drafter.address, graceful=False)
            return
        for req in requests:
            if req.drafter is drafter:
                self.admission.unassign(req)

    def _fail_batch(self, batch: Batch, err: BaseException) -> None:
        """A verifier call failed: fail that batch's requests, keep serving everyone else."""
        batch.drafted = None
        self._fail(list(batch.requests), *verify_failure(batch.index, err))
