"""The public Generation API over gRPC: requests read off the wire into the front end's
GenerationRequest, its events written back as messages, its refusals as statuses (with a
BadRequest naming the field). Transport only: the checks and the streaming are gateway/frontend.py's."""

from __future__ import annotations

from contextlib import aclosing

import grpc

from gateway.frontend import Frontend, GenerationRequest, RequestError
from gateway.request import ActiveRequest
from gateway.status_details import abort
from gateway.validation import max_draft_from_proto
from minedraft import __version__
from minedraft.protocol import params_from_proto, stats_to_proto
from minedraft.v1 import generation_pb2, generation_pb2_grpc


class GenerationServicer(generation_pb2_grpc.GenerationServicer):
    def __init__(self, frontend: Frontend, info: generation_pb2.ServerInfo) -> None:
        self.frontend = frontend
        self.manager = frontend.manager
        self.info = info

    async def _build(self, request: generation_pb2.GenerateRequest,
                     context: grpc.aio.ServicerContext) -> ActiveRequest:
        try:
            return await self.frontend.build(generation_request(request))
        except RequestError as err:
            await abort(context, err)

    async def GenerateStream(self, request, context):
        req = await self._build(request, context)
        prompt_tokens = len(req.seq.prompt_token_ids)
        try:
            self.frontend.submit(req)
            async with aclosing(self.frontend.events(req)) as events:
                async for event in events:
                    message = generation_pb2.GenerateStreamResponse(
                        request_id=req.client_id, text=event.text, token_ids=event.token_ids,
                        prompt_tokens=prompt_tokens)
                    if event.finish_reason is not None:
                        message.finish_reason = event.finish_reason
                        message.stats.CopyFrom(stats_to_proto(req.seq.stats))
                    yield message
        except RequestError as err:
            await abort(context, err)

    async def Generate(self, request, context) -> generation_pb2.GenerateResponse:
        req = await self._build(request, context)
        text, finish_reason = [], ""
        try:
            self.frontend.submit(req)
            async with aclosing(self.frontend.events(req)) as events:
                async for event in events:
                    text.append(event.text)
                    finish_reason = event.finish_reason or finish_reason
        except RequestError as err:
            await abort(context, err)
        return generation_pb2.GenerateResponse(
            request_id=req.client_id, text="".join(text), token_ids=req.seq.output_token_ids,
            finish_reason=finish_reason, stats=stats_to_proto(req.seq.stats),
            prompt_tokens=len(req.seq.prompt_token_ids))

    async def GetServerInfo(self, request, context) -> generation_pb2.ServerInfo:
        pool = self.manager.pool
        if pool is not None:
            self.info.num_drafters = len(pool)
            if pool.drafters:
                self.info.draft_model = next(iter(pool.drafters.values())).model
        info = generation_pb2.ServerInfo()
        info.CopyFrom(self.info)
        cost_model, plan = self.manager.describe()
        info.cost_model.CopyFrom(cost_model)
        if plan is not None:
            info.plan.CopyFrom(plan)
        return info

    async def GetStepStats(self, request, context) -> generation_pb2.StepStats:
        steps = list(self.manager.step_records)
        if request.max_steps:
            steps = steps[-request.max_steps:]
        return generation_pb2.StepStats(steps=steps)


def generation_request(request: generation_pb2.GenerateRequest) -> GenerationRequest:
    """The message's fields as the front end takes them (text, or token ids when it is empty)."""
    try:
        return GenerationRequest(prompt=request.prompt or list(request.prompt_token_ids),
                                 params=params_from_proto(request.sampling),
                                 max_draft=max_draft_from_proto(request.sampling), client_id=request.request_id)
    except ValueError as err:
        raise RequestError.invalid(str(err)) from None


def server_info(mode: str, k: int, max_batch: int, target: str,
                synthetic_acceptance: float) -> generation_pb2.ServerInfo:
    """What stays fixed while the gateway runs; the pool's part is filled in per call."""
    return generation_pb2.ServerInfo(version=__version__, mode=mode, k=k, target_model=target,
                                     max_batch=max_batch, synthetic_acceptance=synthetic_acceptance)
