"""The public Generation API: validation, tokenisation, streaming. Transport only."""

from __future__ import annotations

import asyncio
import itertools
import random

import grpc

from gateway.batch_manager import BatchManager
from gateway.pool import DrafterUnreachable, PoolError
from gateway.request import ActiveRequest, StreamEvent
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
        try:
            params = params_from_proto(request.sampling)
        except ValueError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        if request.prompt:
            loop = asyncio.get_running_loop()
            prompt_ids = await loop.run_in_executor(None, self.tokenizer.encode, request.prompt)
        else:
            prompt_ids = list(request.prompt_token_ids)
        if not prompt_ids:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "prompt: empty (give prompt or prompt_token_ids)")
        bad = [t for t in prompt_ids if not 0 <= t < self.vocab_size]
        if bad:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"prompt_token_ids: {bad[0]} is outside the vocabulary [0, {self.vocab_size})")
        if len(prompt_ids) >= self.max_model_len:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"prompt: {len(prompt_ids)} tokens; the model's limit is {self.max_model_len}")
        request_id = request.request_id or f"req-{next(self._ids)}"
        if request_id in self.manager.requests:
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, f"request_id: {request_id!r} is already running")
        seed = params.seed if params.seed is not None else random.getrandbits(63)
        seq = Sequence(request_id, prompt_ids, params, seed, self.eos_token_ids, self.max_model_len)
        req = ActiveRequest(seq, IncrementalDetokenizer(self.tokenizer, prompt_ids), StopStringMatcher(params.stop))
        if not self.manager.admission.fits_ever(req):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "sampling.max_tokens: prompt + max_tokens exceed the KV cache capacity")
        return req

    async def _events(self, req: ActiveRequest, context):
        self.manager.submit(req)
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
                request_id=req.request_id, text=event.text, token_ids=event.token_ids,
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
            request_id=req.request_id, text="".join(text), token_ids=req.seq.output_token_ids,
            finish_reason=finish_reason, stats=stats_to_proto(req.seq.stats),
            prompt_tokens=len(req.seq.prompt_token_ids))

    async def GetServerInfo(self, request, context) -> generation_pb2.ServerInfo:
        pool = self.manager.pool
        if pool is not None:
            self.info.num_drafters = len(pool)
            if pool.drafters:
                self.info.draft_model = next(iter(pool.drafters.values())).model
        return self.info

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


REGISTER_TIMEOUT_S = 10.0


class DrafterPoolServicer(generation_pb2_grpc.DrafterPoolServicer):
    """Drafters join and leave the pool at run time."""

    def __init__(self, manager: BatchManager) -> None:
        self.manager = manager

    async def Register(self, request: generation_pb2.DrafterEndpoint, context) -> generation_pb2.PoolStatus:
        if self.manager.pool is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "this gateway runs in ar mode: no drafters")
        try:
            # A drafter that registers is already serving: it answers at once or not at all.
            await self.manager.add_drafter(request.address, timeout_s=REGISTER_TIMEOUT_S)
        except PoolError as err:
            code = (grpc.StatusCode.UNAVAILABLE if isinstance(err, DrafterUnreachable)
                    else grpc.StatusCode.INVALID_ARGUMENT)
            await context.abort(code, str(err))
        except grpc.aio.AioRpcError as err:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"address: drafter {request.address}: {err.details()}")
        return self.manager.pool.status()

    async def Deregister(self, request: generation_pb2.DrafterEndpoint, context) -> generation_pb2.PoolStatus:
        if self.manager.pool is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "this gateway runs in ar mode: no drafters")
        if self.manager.remove_drafter(request.address) is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"address: {request.address!r} is not in the pool")
        return self.manager.pool.status()

    async def List(self, request, context) -> generation_pb2.PoolStatus:
        pool = self.manager.pool
        return pool.status() if pool is not None else generation_pb2.PoolStatus()
