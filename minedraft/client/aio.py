"""asyncio client for the gateway: Generation and the drafter pool over one channel."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import grpc
import grpc.aio
from google.protobuf.message import Message

from minedraft.client.base import ClientBase
from minedraft.client.errors import RequestCancelled, error_from_rpc
from minedraft.client.types import (CLIENT_TIMEOUT, DrafterInfo, GenerationResult, Prompt,
                                    SamplingOptions, StreamChunk, Timeout, build_request,
                                    drafters_from_proto, message_to_dict)
from minedraft.service.security import DialSecurity
from minedraft.v1 import generation_pb2


class AsyncChunkStream:
    """Async iterator over a streaming call that cancels the RPC when abandoned (see ChunkStream)."""

    def __init__(self, call: grpc.aio.UnaryStreamCall) -> None:
        self._call = call

    def __aiter__(self) -> AsyncChunkStream:
        return self

    async def __anext__(self) -> StreamChunk:
        try:
            response = await self._call.read()
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None
        except asyncio.CancelledError:
            if self._call.cancelled():  # our own cancel(), not the caller's task being cancelled
                raise RequestCancelled(grpc.StatusCode.CANCELLED, "stream cancelled") from None
            raise
        if response is grpc.aio.EOF:
            raise StopAsyncIteration
        return StreamChunk.from_proto(response)

    def cancel(self) -> None:
        """Cancel the call if it is still running (no-op once finished)."""
        if not self._call.done():
            self._call.cancel()

    async def aclose(self) -> None:
        self.cancel()

    async def __aenter__(self) -> AsyncChunkStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.cancel()

    def __del__(self) -> None:
        self.cancel()


class AsyncClient(ClientBase):
    """asyncio client; create and use it inside one running event loop."""

    _open_channel = staticmethod(DialSecurity.aio_channel)

    async def _unary(self, method: Callable[..., Any], request: Message, timeout: Timeout) -> Any:
        """One unary call, its failure raised as the matching MineDraftError."""
        try:
            return await method(request, timeout=self._timeout(timeout))
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None

    async def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until the channel connects, so start-up scripts fail fast with a clear error."""
        try:
            await asyncio.wait_for(self._channel.channel_ready(), timeout)
        except asyncio.TimeoutError:
            raise self._not_ready(timeout) from None

    async def generate(self, prompt: Prompt, options: SamplingOptions | None = None, *,
                       request_id: str = "", timeout: Timeout = CLIENT_TIMEOUT,
                       **overrides: Any) -> GenerationResult:
        """Generate a completion and wait for all of it (options as for Client.generate)."""
        request = build_request(prompt, options, request_id=request_id, **overrides)
        return GenerationResult.from_proto(await self._unary(self._stub.Generate, request, timeout))

    def stream(self, prompt: Prompt, options: SamplingOptions | None = None, *,
               request_id: str = "", timeout: Timeout = CLIENT_TIMEOUT,
               **overrides: Any) -> AsyncChunkStream:
        """Generate chunk by chunk (``async for``), with generate's options; stop to cancel it."""
        request = build_request(prompt, options, request_id=request_id, **overrides)
        return AsyncChunkStream(self._stub.GenerateStream(request, timeout=self._timeout(timeout)))

    async def server_info(self, timeout: Timeout = CLIENT_TIMEOUT) -> dict[str, Any]:
        """Mode, k, models and batch size the server runs with."""
        info = await self._unary(self._stub.GetServerInfo, generation_pb2.ServerInfoRequest(),
                                 timeout)
        return message_to_dict(info)

    async def step_stats(self, max_steps: int = 0,
                         timeout: Timeout = CLIENT_TIMEOUT) -> list[dict[str, Any]]:
        """Recent per-step timings (0 = as many as the server keeps)."""
        stats = await self._unary(self._stub.GetStepStats,
                                  generation_pb2.StepStatsRequest(max_steps=max_steps), timeout)
        return [message_to_dict(step) for step in stats.steps]

    async def drafters(self, timeout: Timeout = CLIENT_TIMEOUT) -> list[DrafterInfo]:
        """The gateway's drafter pool (empty in ar mode). The pool calls are served on the
        gateway's admin address (--admin-port), not its public one: point this client there."""
        pool = await self._unary(self._pool.List, generation_pb2.ListDraftersRequest(), timeout)
        return drafters_from_proto(pool)

    async def register_drafter(self, address: str,
                               timeout: Timeout = CLIENT_TIMEOUT) -> list[DrafterInfo]:
        """Add the drafter at HOST:PORT to the pool (no-op if already there); returns the pool.

        The gateway waits up to 10 s for the drafter to answer.
        """
        pool = await self._unary(self._pool.Register,
                                 generation_pb2.DrafterEndpoint(address=address), timeout)
        return drafters_from_proto(pool)

    async def deregister_drafter(self, address: str,
                                 timeout: Timeout = CLIENT_TIMEOUT) -> list[DrafterInfo]:
        """Take the drafter out of the pool (its requests move to others); returns the pool."""
        pool = await self._unary(self._pool.Deregister,
                                 generation_pb2.DrafterEndpoint(address=address), timeout)
        return drafters_from_proto(pool)

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
