"""gRPC handlers of the verifier: transport only, over `minedraft.verifier.Verifier`.

All model work runs on one compute thread so the event loop never blocks; steps are
serialised there in arrival order. Drafts arrive on the data plane, matched by the
drafter's step id.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import grpc

from minedraft.data_plane import DraftReceiver, InBandDraftReceiver, decode_payload
from minedraft.kv_cache import OutOfBlocks
from minedraft.protocol import params_from_proto
from minedraft.service import engine_info
from minedraft.v1 import engine_pb2, engine_pb2_grpc
from minedraft.verifier import Verifier


class VerifierServicer(engine_pb2_grpc.VerifierServicer):
    def __init__(self, verifier: Verifier, receiver: DraftReceiver | None, data_plane: str,
                 data_plane_address: str, model_name: str) -> None:
        self.verifier = verifier
        self.receiver = receiver
        self.data_plane = data_plane
        self.data_plane_address = data_plane_address
        self.model_name = model_name
        self.compute = ThreadPoolExecutor(max_workers=1, thread_name_prefix="verify")

    async def Step(self, request: engine_pb2.VerifyStepRequest, context) -> engine_pb2.VerifyStepResponse:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self.compute, self._step, request)
        except (ValueError, KeyError) as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"verify step {request.step_id}: {err}")
        except OutOfBlocks as err:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(err))
        except TimeoutError as err:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, str(err))

    def _step(self, request: engine_pb2.VerifyStepRequest) -> engine_pb2.VerifyStepResponse:
        for rid in request.finished:
            self.verifier.remove_request(rid)
        for new in request.new_requests:
            self.verifier.add_request(new.request_id, list(new.token_ids),
                                      params_from_proto(new.sampling), new.seed)
        ks = [item.num_draft for item in request.items]
        total = sum(ks)
        recv_s = 0.0
        drafts: list[list[int]] = [[] for _ in ks]
        draft_probs = None
        if total:
            if self.receiver is None:
                raise ValueError("drafts expected but this verifier has no data plane")
            start = time.perf_counter()
            runner = self.verifier.runner
            payload = self.receiver.recv(request.draft_step_id, total, request.with_probs,
                                         runner.vocab_size, runner.config.torch_dtype)
            recv_s = time.perf_counter() - start
            flat = payload.token_ids.tolist()
            offset = 0
            for i, k in enumerate(ks):
                drafts[i] = flat[offset:offset + k]
                offset += k
            if payload.probs is not None:
                draft_probs = payload.probs.float()
        start = time.perf_counter()
        # Requests that finished or were cancelled after they were drafted: their drafts
        # were received (the payload covers the whole batch) and are dropped here.
        keep = [i for i, item in enumerate(request.items) if item.request_id in self.verifier]
        items = [(request.items[i].request_id, drafts[i]) for i in keep]
        if draft_probs is not None and len(keep) < len(ks):
            offsets = [sum(ks[:i]) for i in range(len(ks))]
            rows = [r for i in keep for r in range(offsets[i], offsets[i] + ks[i])]
            draft_probs = draft_probs[rows]
        new_tokens = self.verifier.verify(items, draft_probs) if items else []
        busy_s = time.perf_counter() - start
        return engine_pb2.VerifyStepResponse(
            step_id=request.step_id, busy_s=busy_s, recv_s=recv_s,
            free_blocks=self.verifier.runner.blocks.num_free_blocks,
            results=[engine_pb2.VerifyResult(request_id=rid, token_ids=tokens)
                     for (rid, _), tokens in zip(items, new_tokens)])

    async def PutDrafts(self, request: engine_pb2.DraftPayload, context) -> engine_pb2.PutDraftsResponse:
        if not isinstance(self.receiver, InBandDraftReceiver):
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"this verifier's data plane is {self.data_plane!r}, not 'inband'")
        self.receiver.deliver(decode_payload(
            step_id=request.step_id, draft_token_ids=request.draft_token_ids,
            draft_probs=request.draft_probs, probs_dtype=request.probs_dtype,
            num_tokens=request.num_tokens))
        return engine_pb2.PutDraftsResponse()

    async def GetInfo(self, request, context) -> engine_pb2.EngineInfo:
        return engine_info(self.verifier.runner, self.model_name, self.data_plane, self.data_plane_address,
                           self.verifier.synthetic_acceptance)
