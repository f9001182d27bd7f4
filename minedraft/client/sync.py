"""Blocking client for the gateway: Generation and the drafter pool over one channel."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf.message import Message

from minedraft.client.base import ClientBase
from minedraft.client.errors import error_from_rpc
from minedraft.client.types import (CLIENT_TIMEOUT, DrafterInfo, GenerationResult, Prompt,
                                    SamplingOptions, StreamChunk, Timeout, build_request,
                                    drafters_from_proto, message_to_dict)
from minedraft.service.security import DialSecurity
from minedraft.v1 import generation_pb2


class ChunkStream:
    """Iterator over a streaming call that cancels the RPC when abandoned.

    Breaking out of a ``for`` loop drops the last reference, and ``__del__`` cancels the
    call so the server stops generating; ``close()`` or ``with`` does it explicitly.
    """

    def __init__(self, call: Any) -> None:
        self._call = call

    def __iter__(self) -> ChunkStream:
        return self

    def __next__(self) -> StreamChunk:
        try:
            return StreamChunk.from_proto(next(self._call))
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None

    def close(self) -> None:
        """Cancel the call if it is still running (no-op once finished)."""
        if not self._call.done():
            self._call.cancel()

    cancel = close

    def __enter__(self) -> ChunkStream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


class Client(ClientBase):
    """Blocking client; one channel, safe to share between threads."""

    _open_channel = staticmethod(DialSecurity.channel)

    def _unary(self, method: Callable[..., Any], request: Message, timeout: Timeout) -> Any:
        """One unary call, its failure raised as the matching MineDraftError."""
        try:
            return method(request, timeout=self._timeout(timeout))
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None

    def wait_ready(self, timeout: float | None = None) -> None:
        """Block until the channel connects, so start-up scripts fail fast with a clear error."""
        ready = grpc.channel_ready_future(self._channel)
        try:
            ready.result(timeout=timeout)
        except grpc.FutureTimeoutError:
            ready.cancel()
            raise self._not_ready(timeout) from None

    def generate(self, prompt: Prompt, options: SamplingOptions | None = None, *,
                 request_id: str = "", timeout: Timeout = CLIENT_TIMEOUT,
                 **overrides: Any) -> GenerationResult:
        """Generate a completion and wait for all of it.

        Sampling comes from `options` with any SamplingOptions field given as a keyword on top;
        `speculation` ("auto", "off" or N) caps this request's draft tokens a step.
        """
        request = build_request(prompt, options, request_id=request_id, **overrides)
        return GenerationResult.from_proto(self._unary(self._stub.Generate, request, timeout))

    def stream(self, prompt: Prompt, options: SamplingOptions | None = None, *,
               request_id: str = "", timeout: Timeout = CLIENT_TIMEOUT,
               **overrides: Any) -> ChunkStream:
        """Generate chunk by chunk, with generate's options; stop iterating to cancel it."""
        request = build_request(prompt, options, request_id=request_id, **overrides)
        return ChunkStream(self._stub.GenerateStream(request, timeout=self._timeout(timeout)))

    def server_info(self, timeout: Timeout = CLIENT_TIMEOUT) -> dict[str, Any]:
        """Mode, k, models and batch size the server runs with."""
        info = self._unary(self._stub.GetServerInfo, generation_pb2.ServerInfoRequest(), timeout)
        return message_to_dict(info)

    def step_stats(self, max_steps: int = 0, timeout: Timeout = CLIENT_TIMEOUT) -> list[dict[str, Any]]:
        """Recent per-step timings (0 = as many as the server keeps)."""
        stats = self._unary(self._stub.GetStepStats,
                            generation_pb2.StepStatsRequest(max_steps=max_steps), timeout)
        return [message_to_dict(step) for step in stats.steps]

    def drafters(self, timeout: Timeout = CLIENT_TIMEOUT) -> list[DrafterInfo]:
        """The gateway's drafter pool (empty in ar mode). The pool calls are served on the
        gateway's admin address (--admin-port), not its public one: point this client there."""
        pool = self._unary(self._pool.List, generation_pb2.ListDraftersRequest(), timeout)
        return drafters_from_proto(pool)

    def register_drafter(self, address: str, timeout: Timeout = CLIENT_TIMEOUT) -> list[DrafterInfo]:
        """Add the drafter at HOST:PORT to the pool (no-op if already there); returns the pool.

        The gateway waits up to 10 s for the drafter to answer.
        """
        pool = self._unary(self._pool.Register, generation_pb2.DrafterEndpoint(address=address),
                           timeout)
        return drafters_from_proto(pool)

    def deregister_drafter(self, address: str,
                           timeout: Timeout = CLIENT_TIMEOUT) -> list[DrafterInfo]:
        """Take the drafter out of the pool (its requests move to others); returns the pool."""
        pool = self._unary(self._pool.Deregister, generation_pb2.DrafterEndpoint(address=address),
                           timeout)
        return drafters_from_proto(pool)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
