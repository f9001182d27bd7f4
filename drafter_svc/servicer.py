"""gRPC handlers of the drafter: transport only, over `minedraft.drafter.Drafter`.

Drafting runs on one compute thread; sending the drafts runs on a second thread, so a
step returns as soon as its drafts are handed to the data plane (the verifier picks them
up when it verifies that batch, possibly a whole step later in batch-parallel mode).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import grpc
import torch

from minedraft.data_plane import DraftPayload, DraftSender
from minedraft.drafter import Drafter
from minedraft.engine_requests import StepCheck, UnknownRequest
from minedraft.kv_cache import OutOfBlocks
from minedraft.protocol import engine_info, params_from_proto
from minedraft.service.placement import compute_thread
from minedraft.v1 import engine_pb2, engine_pb2_grpc

logger = logging.getLogger("minedraft.drafter")


class DrafterServicer(engine_pb2_grpc.DrafterServicer):
    def __init__(self, drafter: Drafter, sender: DraftSender, data_plane: str, model_name: str,
                 drafter_id: str, compute: ThreadPoolExecutor | None = None) -> None:
        """compute: the thread the drafter's model was loaded on (`compute_thread`); a new
        one if None."""
        self.drafter = drafter
        self.drafter_id = drafter_id
        self.instance_id = uuid.uuid4().hex
        self.sender = sender
        self.send_failed = False        # the pairing broke: the keep-alive pairs again
        self.dismissed = False          # deregistered from the pool: do not rejoin by itself
        self.data_plane = data_plane
        self.model_name = model_name
        self.compute = compute or compute_thread("draft")
        self.sending = ThreadPoolExecutor(max_workers=1, thread_name_prefix="send")

    async def Step(self, request: engine_pb2.DraftStepRequest, context) -> engine_pb2.DraftStepResponse:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self.compute, self._step, request)
        except UnknownRequest as err:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"draft step {request.step_id}: {err}")
        except (ValueError, KeyError) as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"draft step {request.step_id}: {err}")
        except OutOfBlocks as err:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(err))

    def _step(self, request: engine_pb2.DraftStepRequest) -> engine_pb2.DraftStepResponse:
        if request.dismiss and not self.dismissed:
            logger.warning("deregistered from the drafter pool: not rejoining until restarted")
            self.dismissed = True
        if request.reset:
            self.drafter.remove_all()
        check_draft_step(request, self.drafter)
        for rid in request.finished:
            self.drafter.remove_request(rid)
        for new in request.new_requests:
            self.drafter.add_request(new.request_id, list(new.token_ids),
                                     params_from_proto(new.sampling), new.seed)
        for diff in request.updates:
            self.drafter.append_tokens(diff.request_id, list(diff.new_token_ids))
        start = time.perf_counter()
        if request.catch_up:
            self.drafter.catch_up([item.request_id for item in request.items])
            return engine_pb2.DraftStepResponse(step_id=request.step_id, busy_s=time.perf_counter() - start,
                                                sent_bytes=self.sender.last_bytes)
        items = [(item.request_id, item.num_draft) for item in request.items]
        output = self.drafter.draft(items)
        busy_s = time.perf_counter() - start
        flat = [t for tokens in output.draft_token_ids for t in tokens]
        if flat:
            self.sending.submit(self._send, DraftPayload(request.step_id, torch.tensor(flat, dtype=torch.int64)))
        # The send runs after this answer: these are the previous completed send's figures.
        return engine_pb2.DraftStepResponse(step_id=request.step_id, busy_s=busy_s,
                                            sent_bytes=self.sender.last_bytes)

    def _send(self, payload: DraftPayload) -> None:
        """On the send thread. A failed send loses only these drafts (the verifier verifies
        them at k = 0); the pairing is then renewed by the keep-alive."""
        try:
            self.sender.send(payload)
        except Exception as err:            # noqa: BLE001 - logged, and the pairing is renewed
            if not self.send_failed:
                logger.warning("data plane: sending drafts of step %d failed (%s); pairing again",
                               payload.step_id, err)
            self.send_failed = True

    def replace_sender(self, sender: DraftSender) -> None:
        """A new pairing: sends queued from now on use it; the old one closes after them."""
        old, self.sender = self.sender, sender
        self.send_failed = False
        self.sending.submit(old.close)

    async def GetInfo(self, request, context) -> engine_pb2.EngineInfo:
        info = engine_info(self.drafter, self.model_name, self.data_plane, self.instance_id)
        info.drafter_id = self.drafter_id
        return info


def check_draft_step(request: engine_pb2.DraftStepRequest, drafter: Drafter) -> None:
    """Refuse a step that names unknown requests or repeats known ones, before it changes anything."""
    check = StepCheck(drafter, request.finished)
    check.add_new(request.new_requests)
    for diff in request.updates:
        if diff.request_id in check.new_ids:
            raise ValueError(f"updates: request {diff.request_id!r} is new in this step")
        check.require(diff.request_id, "updates")
        drafter.check_tokens(list(diff.new_token_ids), f"updates: request {diff.request_id!r}")
    for item in request.items:
        check.require(item.request_id, "items")
        if request.catch_up and item.num_draft:
            raise ValueError(f"items: request {item.request_id!r} asks for {item.num_draft} drafts in a "
                             f"catch_up step, which drafts nothing")
