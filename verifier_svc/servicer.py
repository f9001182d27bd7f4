"""gRPC handlers of the verifier (tensor-parallel rank 0): transport only.

All model work runs on one compute thread so the event loop never blocks; steps are
serialised there in arrival order. Each step is handed to `StepExecutor.lead`, which takes
its drafts off the data plane (one pairing per drafter, matched by the drafter's step id)
and shares the step with the other tensor-parallel ranks.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import grpc

from minedraft.data_plane import DraftPairings, decode_payload
from minedraft.kv_cache import OutOfBlocks
from minedraft.service import engine_info
from minedraft.v1 import engine_pb2, engine_pb2_grpc
from verifier_svc.steps import StepExecutor


class VerifierServicer(engine_pb2_grpc.VerifierServicer):
    def __init__(self, executor: StepExecutor, pairings: DraftPairings, model_name: str) -> None:
        self.executor = executor
        self.pairings = pairings
        self.model_name = model_name
        self.compute = ThreadPoolExecutor(max_workers=1, thread_name_prefix="verify")

    async def Step(self, request: engine_pb2.VerifyStepRequest, context) -> engine_pb2.VerifyStepResponse:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self.compute, self.executor.lead, request, self.pairings)
        except (ValueError, KeyError) as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"verify step {request.step_id}: {err}")
        except OutOfBlocks as err:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(err))

    async def ConnectDrafter(self, request: engine_pb2.ConnectDrafterRequest,
                             context) -> engine_pb2.ConnectDrafterResponse:
        try:
            address = self.pairings.connect(request.drafter_id)
        except ValueError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        return engine_pb2.ConnectDrafterResponse(data_plane=self.pairings.backend, address=address)

    async def DisconnectDrafter(self, request: engine_pb2.DisconnectDrafterRequest,
                                context) -> engine_pb2.DisconnectDrafterResponse:
        await asyncio.get_running_loop().run_in_executor(None, self.pairings.disconnect, request.drafter_id)
        return engine_pb2.DisconnectDrafterResponse()

    async def PutDrafts(self, request: engine_pb2.DraftPayload, context) -> engine_pb2.PutDraftsResponse:
        if self.pairings.backend != "inband":
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"this verifier's data plane is {self.pairings.backend!r}, not 'inband'")
        try:
            self.pairings.deliver(request.drafter_id, decode_payload(
                step_id=request.step_id, draft_token_ids=request.draft_token_ids,
                draft_probs=request.draft_probs, probs_dtype=request.probs_dtype,
                num_tokens=request.num_tokens))
        except KeyError as err:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err.args[0]))
        except ValueError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        return engine_pb2.PutDraftsResponse()

    async def GetInfo(self, request, context) -> engine_pb2.EngineInfo:
        verifier = self.executor.verifier
        info = engine_info(verifier.runner, self.model_name, self.pairings.backend,
                           synthetic_acceptance=verifier.synthetic_acceptance)
        info.tp_size = self.executor.tp.size
        return info
