"""The public Generation API: validation, tokenisation, streaming. Transport only."""

from __future__ import annotations

import asyncio
import itertools
import random

import grpc

from gateway.batch_manager import BatchManager, Overloaded
from gateway.request import ActiveRequest, StreamEvent
from gateway.validation import (check_prompt_ids, check_prompt_text, check_stop_token_ids, clamp_max_tokens,
                                max_draft_from_proto)
from minedraft import __version__
from minedraft.detokenizer import IncrementalDetokenizer, StopStringMatcher
from minedraft.protocol import params_from_proto, stats_to_proto
from minedraft.sequence import Sequence
from minedraft.v1 import generation_pb2, generation_pb2_grpc


class GenerationServicer(generation_pb2_grpc.GenerationServicer):
    def __init__(self, manager: BatchManager, tokenizer, vocab_size: int, eos_token_ids: tuple[int, ...],
                 max_model_len: int, info: generation_pb2.ServerInfo) -> None:
        self.manager = manager
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        self.info = info
        self._ids = itertools.count(1)

    async def _build(self, request: generation_pb2.GenerateRequest, context) -> ActiveRequest:
        """Validate every field before anything is reserved; the first bad one is refused
        with INVALID_ARGUMENT naming it (see docs/reliability.md)."""
        if self.manager.unavailable:
            await context.abort(grpc.StatusCode.UNAVAILABLE, self.manager.unavailable)
        try:
            params = params_from_proto(request.sampling)
            max_draft = max_draft_from_proto(request.sampling, self.info.k)
            prompt_ids = await self._prompt_ids(request)
            params = clamp_max_tokens(params, len(prompt_ids), self.max_model_len)
            check_stop_token_ids(params, self.vocab_size)
        except ValueError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        # Server-side ids are unique whatever clients send: a client's own id is kept for its
        # answers only, so no client can take, or collide with, another request's id.
        number = next(self._ids)
        request_id = f"{request.request_id}#{number}" if request.request_id else f"req-{number}"
        seed = params.seed if params.seed is not None else random.getrandbits(63)
        seq = Sequence(request_id, prompt_ids, params, seed, self.eos_token_ids, self.max_model_len)
        req = ActiveRequest(seq, IncrementalDetokenizer(self.tokenizer, prompt_ids), StopStringMatcher(params.stop),
                            client_id=request.request_id or request_id, max_draft=max_draft)
        if not self.manager.admission.fits_ever(req):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "sampling.max_tokens: prompt + max_tokens exceed the KV cache capacity")
        return req

    async def _prompt_ids(self, request: generation_pb2.GenerateRequest) -> list[int]:
        if request.prompt:
            check_prompt_text(request.prompt, self.max_model_len)
            loop = asyncio.get_running_loop()
            prompt_ids = await loop.run_in_executor(None, self.tokenizer.encode, request.prompt)
        else:
            prompt_ids = list(request.prompt_token_ids)
        check_prompt_ids(prompt_ids, self.vocab_size, self.max_model_len)
        return prompt_ids

    async def _events(self, req: ActiveRequest, context):
        try:
            self.manager.submit(req)
        except Overloaded as err:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(err))
        try:
            while True:
                event: StreamEvent = await req.events.get()
                if event.error is not None:
                    await context.abort(*event.error)
                yield event
                if event.finish_reason is not None:
                    return
        finally:
            if not req.done:
                self.manager.cancel(req.request_id)

    async def GenerateStream(self, request, context):
        req = await self._build(request, context)
        prompt_tokens = len(req.seq.prompt_token_ids)
        async for event in self._events(req, context):
            message = generation_pb2.GenerateStreamResponse(
                request_id=req.client_id, text=event.text, token_ids=event.token_ids,
                prompt_tokens=prompt_tokens)
            if event.finish_reason is not None:
                message.finish_reason = event.finish_reason
                message.stats.CopyFrom(stats_to_proto(req.seq.stats))
            yield message

    async def Generate(self, request, context) -> generation_pb2.GenerateResponse:
        req = await self._build(request, context)
        text, finish_reason = [], ""
        async for event in self._events(req, context):
            text.append(event.text)
            finish_reason = event.finish_reason or finish_reason
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


def server_info(mode: str, k: int, max_batch: int, target: str,
                synthetic_acceptance: float) -> generation_pb2.ServerInfo:
    """What stays fixed while the gateway runs; the pool's part is filled in per call."""
    return generation_pb2.ServerInfo(version=__version__, mode=mode, k=k, target_model=target,
                                     max_batch=max_batch, synthetic_acceptance=synthetic_acceptance)
