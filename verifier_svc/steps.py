"""One verify step, executed identically on every tensor-parallel rank.

Rank 0 (the driver) collects the step's drafts from the data plane (one pairing per
drafter), resolves what it will verify, and broadcasts that to the other ranks: the step's
control message, rewritten so it names no drafter (each item's num_draft is what arrived,
0 for drafts lost with their drafter), then the flat draft tokens. Every rank then runs the
same deterministic code on the same inputs (the logits are gathered to full vocabulary on
each rank and sampling noise is keyed by seed and position), so their request tables and KV
caches stay in lockstep with no further communication.
"""

from __future__ import annotations

import logging
import math
import time

import torch

from minedraft.data_plane import DraftPairings
from minedraft.engine_requests import StepCheck, UnknownRequest
from minedraft.parallel import TPGroup
from minedraft.protocol import params_from_proto
from minedraft.service.cpu_lending import CoreLender
from minedraft.v1 import engine_pb2
from minedraft.verifier import Verifier

logger = logging.getLogger("minedraft.verifier")
_STOP = b""          # broadcast to the followers when the driver shuts down
DRAFT_WAIT_S = 60.0  # how long a step with no deadline waits for its drafts


class StepExecutor:
    def __init__(self, verifier: Verifier, tp: TPGroup, lender: CoreLender | None = None) -> None:
        """lender: the drafter's cores, computed on too by steps that say borrow_cpus (rank 0
        of a one-rank group on CPU only; None: nothing to borrow)."""
        self.verifier = verifier
        self.tp = tp
        self.lender = lender
        runner = verifier.runner
        self.vocab_size, self.device = runner.vocab_size, runner.device

    # ---- rank 0 --------------------------------------------------------------------------
    def lead(self, request: engine_pb2.VerifyStepRequest, pairings: DraftPairings | None,
             recv_deadline: float | None = None) -> engine_pb2.VerifyStepResponse:
        """recv_deadline (time.monotonic()): drafts not arrived by then are lost (k = 0)."""
        # First of all: a step without borrow_cpus means drafting resumed, and the drafter
        # needs its cores back before it can send this step's drafts.
        borrowed = self.lender.use(request.borrow_cpus) if self.lender is not None else False
        check_step(request, self.verifier)      # before any draft is taken off the data plane
        for source in request.sources:
            if pairings is None or not pairings.ever_paired(source.drafter_id):
                raise UnknownRequest(f"sources: drafter {source.drafter_id!r} never paired with this verifier")
        resolved, token_ids, recv_s, waited_s = self._collect(request, pairings, recv_deadline)
        if self.tp.size > 1:
            self.tp.broadcast_bytes(resolved.SerializeToString())
            token_ids = self._broadcast_drafts(resolved, token_ids)
        response = self.execute(resolved, token_ids)
        response.recv_s = recv_s
        response.drafts_wait_s = waited_s
        response.borrowed = borrowed
        return response

    def stop_followers(self) -> None:
        if self.tp.size > 1:
            self.tp.broadcast_bytes(_STOP)

    def _collect(self, request: engine_pb2.VerifyStepRequest, pairings: DraftPairings | None,
                 recv_deadline: float | None = None):
        """-> (request naming no drafter, flat draft tokens [n], seconds taking them off the
        data plane, seconds waiting for them to be drafted)."""
        items = list(request.items)
        if not math.isfinite(request.drafts_wait_s) or request.drafts_wait_s < 0:
            raise ValueError(f"drafts_wait_s: expected a finite number >= 0, got {request.drafts_wait_s}")
        if request.drafts_wait_s:       # the wait starts now: the step may have queued meanwhile
            wait_until = time.monotonic() + request.drafts_wait_s
            recv_deadline = wait_until if recv_deadline is None else min(recv_deadline, wait_until)
        for item in items:
            if item.num_draft and item.source >= len(request.sources):
                raise ValueError(f"items: {item.request_id!r} names draft source {item.source}, "
                                 f"but the step has {len(request.sources)}")
        payloads = []
        waited = 0.0            # for drafts still being drafted (an early verify): not the data plane's
        start = time.perf_counter()
        for index, source in enumerate(request.sources):
            count = sum(item.num_draft for item in items if item.source == index)
            payload = None
            if count:
                if pairings is None:
                    raise ValueError("drafts expected but this verifier has no data plane")
                timeout_s = (DRAFT_WAIT_S if recv_deadline is None
                             else max(0.05, recv_deadline - time.monotonic()))
                payload = pairings.recv(source.drafter_id, source.draft_step_id, count, timeout_s)
                waited += pairings.last_wait_s
            payloads.append(payload)
        recv_s = max(0.0, time.perf_counter() - start - waited)
        for index, (source, payload) in enumerate(zip(request.sources, payloads)):
            if payload is not None and not _in_vocab(payload.token_ids, self.vocab_size):
                logger.warning("step %d: drafter %s sent token ids outside the vocabulary; "
                               "its drafts are dropped", request.step_id, source.drafter_id)
                payloads[index] = None
        per_source = [None if p is None else p.token_ids.to(self.device) for p in payloads]
        offsets = [0] * len(request.sources)
        token_parts = []
        resolved = engine_pb2.VerifyStepRequest(step_id=request.step_id, new_requests=request.new_requests,
                                                finished=request.finished)
        for item in items:
            k = item.num_draft
            tokens = per_source[item.source] if k else None
            if tokens is None:          # no drafts, or lost with their drafter: verify k = 0
                resolved.items.add(request_id=item.request_id, num_draft=0, drop=item.drop)
                continue
            start_row = offsets[item.source]
            offsets[item.source] += k
            token_parts.append(tokens[start_row:start_row + k])
            resolved.items.add(request_id=item.request_id, num_draft=k, drop=item.drop)
        token_ids = (torch.cat(token_parts) if token_parts
                     else torch.empty(0, dtype=torch.int64, device=self.device))
        return resolved, token_ids, recv_s, waited

    def _broadcast_drafts(self, resolved, token_ids: torch.Tensor | None) -> torch.Tensor | None:
        """The driver's flat draft tokens to every rank; followers pass None and get them."""
        total = sum(item.num_draft for item in resolved.items)
        if total == 0:
            return token_ids
        if token_ids is None:
            token_ids = torch.empty(total, dtype=torch.int64, device=self.device)
        self.tp.broadcast(token_ids)
        return token_ids

    # ---- ranks > 0 -----------------------------------------------------------------------
    def follow(self) -> None:
        """Execute the driver's steps until it stops; errors are the driver's to report
        (every rank meets the same ones, so their states stay equal)."""
        while True:
            data = self.tp.broadcast_bytes(None)
            if data == _STOP:
                logger.info("rank %d: driver stopped", self.tp.rank)
                return
            request = engine_pb2.VerifyStepRequest.FromString(data)
            token_ids = self._broadcast_drafts(request, None)
            try:
                self.execute(request, token_ids)
            except (ValueError, KeyError, RuntimeError) as err:
                logger.debug("rank %d step %d: %s", self.tp.rank, request.step_id, err)

    # ---- every rank ----------------------------------------------------------------------
    def execute(self, request: engine_pb2.VerifyStepRequest,
                token_ids: torch.Tensor | None) -> engine_pb2.VerifyStepResponse:
        """Apply frees and new requests, then verify the resolved items. The driver checked
        the step before anything changed (`lead`) and sends the other ranks only checked
        steps: their request tables equal its own, so the check holds there too."""
        verifier = self.verifier
        for rid in request.finished:
            verifier.remove_request(rid)
        for new in request.new_requests:
            verifier.add_request(new.request_id, list(new.token_ids), params_from_proto(new.sampling), new.seed)
        start = time.perf_counter()
        ks = [item.num_draft for item in request.items]
        flat = token_ids.tolist() if token_ids is not None and token_ids.numel() else []
        offsets = [0]
        for k in ks:
            offsets.append(offsets[-1] + k)
        # Requests freed by this very step (cancelled after they were drafted): their drafts
        # arrived with the batch's and are dropped here.
        keep = [i for i, item in enumerate(request.items) if not item.drop and item.request_id in verifier]
        items = [(request.items[i].request_id, flat[offsets[i]:offsets[i + 1]]) for i in keep]
        new_tokens = verifier.verify(items) if items else []
        busy_s = time.perf_counter() - start
        return engine_pb2.VerifyStepResponse(
            step_id=request.step_id, busy_s=busy_s,
            results=[engine_pb2.VerifyResult(request_id=rid, token_ids=tokens, num_draft=len(drafts))
                     for (rid, drafts), tokens in zip(items, new_tokens)])


def check_step(request: engine_pb2.VerifyStepRequest, verifier: Verifier) -> None:
    """Refuse a step that would corrupt the request table, before it changes anything."""
    check = StepCheck(verifier, request.finished)
    check.add_new(request.new_requests)
    for item in request.items:
        if not item.drop:
            check.require(item.request_id, "items", freed_ok=True)


def _in_vocab(token_ids: torch.Tensor, vocab_size: int) -> bool:
    """A step's drafts are a few dozen ids: checked on the host, one transfer at most."""
    ids = token_ids.tolist()
    return not ids or (min(ids) >= 0 and max(ids) < vocab_size)
