"""gRPC handlers of the drafter: transport only, over `minedraft.drafter.Drafter`.

Drafting runs on one compute thread; sending the drafts runs on a second thread, so a
step returns as soon as its drafts are handed to the data plane (the verifier picks them
up when it verifies that batch, possibly a whole step later in batch-parallel mode).
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import torch

from minedraft.data_plane import DraftPayload, DraftSender
from minedraft.drafter import Drafter
from minedraft.kv_cache import OutOfBlocks
from minedraft.protocol import engine_info, params_from_proto
from minedraft.v1 import engine_pb2, engine_pb2_grpc


class DrafterServicer(engine_pb2_grpc.DrafterServicer):
    def __init__(self, drafter: Drafter, sender: DraftSender, data_plane: str, model_name: str,
                 probs_dtype: torch.dtype, drafter_id: str) -> None:
        self.drafter = drafter
        self.drafter_id = drafter_id
        self.sender = sender
        self.data_plane = data_plane
        self.model_name = model_name
        self.probs_dtype = probs_dtype
        self.compute = ThreadPoolExecutor(max_workers=1, thread_name_prefix="draft")
        self.sending = ThreadPoolExecutor(max_workers=1, thread_name_prefix="send")

    async def Step(self, request: engine_pb2.DraftStepRequest, context) -> engine_pb2.DraftStepResponse:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self.compute, self._step, request)
        except (ValueError, KeyError) as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"draft step {request.step_id}: {err}")
        except OutOfBlocks as err:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(err))

    def _step(self, request: engine_pb2.DraftStepRequest) -> engine_pb2.DraftStepResponse:
        for rid in request.finished:
            self.drafter.remove_request(rid)
        for new in request.new_requests:
            self.drafter.add_request(new.request_id, list(new.token_ids),
                                     params_from_proto(new.sampling), new.seed)
        for diff in request.updates:
            self.drafter.append_tokens(diff.request_id, list(diff.new_token_ids))
        start = time.perf_counter()
        items = [(item.request_id, item.num_draft) for item in request.items]
        output = self.drafter.draft(items)
        busy_s = time.perf_counter() - start
        flat = [t for tokens in output.draft_token_ids for t in tokens]
        probs = None if output.draft_probs is None else output.draft_probs.to(self.probs_dtype)
        if flat:
            payload = DraftPayload(request.step_id, torch.tensor(flat, dtype=torch.int64), probs)
            self.sending.submit(self.sender.send, payload)
        # The send runs after this answer: these are the previous completed send's figures.
        return engine_pb2.DraftStepResponse(
            step_id=request.step_id, busy_s=busy_s, sent_bytes=self.sender.last_bytes,
            with_probs=probs is not None)

    async def GetInfo(self, request, context) -> engine_pb2.EngineInfo:
        info = engine_info(self.drafter.runner, self.model_name, self.data_plane)
        info.drafter_id = self.drafter_id
        return info
