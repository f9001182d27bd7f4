"""Python SDK for the gateway's public gRPC API (minedraft.v1.Generation).

Results come back as frozen dataclasses and failures as typed exceptions, so callers never
touch protobuf messages or grpc status objects.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio
from google.protobuf.message import Message

from minedraft.v1 import generation_pb2, generation_pb2_grpc

DEFAULT_TARGET = "localhost:50051"


class _Default(enum.Enum):
    """Sentinel for "use the client's timeout", since None already means "no deadline"."""

    TIMEOUT = enum.auto()


CLIENT_TIMEOUT = _Default.TIMEOUT
Timeout = float | None | _Default


# --------------------------------------------------------------------------- results

@dataclass(frozen=True)
class AcceptanceSummary:
    """Speculative-decoding acceptance for one request (mean length includes the bonus token)."""

    num_steps: int
    num_drafted: int
    num_accepted: int
    mean_acceptance_length: float
    acceptance_rate: float
    drafted_at: tuple[int, ...] = ()     # [j]: steps that drafted position j
    accepted_at: tuple[int, ...] = ()    # [j]: steps whose draft at position j was accepted

    @property
    def acceptance_rate_per_position(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accepted_at, self.drafted_at)]

    @classmethod
    def from_proto(cls, stats: generation_pb2.AcceptanceStats) -> AcceptanceSummary:
        return cls(num_steps=stats.num_steps, num_drafted=stats.num_drafted,
                   num_accepted=stats.num_accepted,
                   mean_acceptance_length=stats.mean_acceptance_length,
                   acceptance_rate=stats.acceptance_rate,
                   drafted_at=tuple(stats.drafted_at), accepted_at=tuple(stats.accepted_at))


@dataclass(frozen=True)
class GenerationResult:
    """A finished request."""

    request_id: str
    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" | "length" | "abort"
    prompt_tokens: int
    stats: AcceptanceSummary

    @classmethod
    def from_proto(cls, response: generation_pb2.GenerateResponse) -> GenerationResult:
        return cls(request_id=response.request_id, text=response.text,
                   token_ids=list(response.token_ids), finish_reason=response.finish_reason,
                   prompt_tokens=response.prompt_tokens,
                   stats=AcceptanceSummary.from_proto(response.stats))


@dataclass(frozen=True)
class StreamChunk:
    """New text and tokens since the previous chunk; the last one carries the outcome."""

    request_id: str
    text: str
    token_ids: list[int]
    finish_reason: str | None  # None until the last chunk
    stats: AcceptanceSummary | None  # set on the last chunk
    prompt_tokens: int = 0

    @classmethod
    def from_proto(cls, response: generation_pb2.GenerateStreamResponse) -> StreamChunk:
        stats = AcceptanceSummary.from_proto(response.stats) if response.HasField("stats") else None
        return cls(request_id=response.request_id, text=response.text,
                   token_ids=list(response.token_ids),
                   finish_reason=response.finish_reason or None, stats=stats,
                   prompt_tokens=response.prompt_tokens)


# --------------------------------------------------------------------------- errors

class MineDraftError(Exception):
    """A failed call; `code` is the gRPC status and `message` the server's explanation."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


class InvalidRequest(MineDraftError):
    """The request was rejected as it stands; retrying it unchanged will fail again."""


class ServerUnavailable(MineDraftError):
    """The server could not be reached or is shutting down; retrying later may succeed."""


class RequestTimeout(MineDraftError):
    """The deadline passed before the request finished."""


class ResourceExhausted(MineDraftError):
    """The server is at capacity (queue full, request too large)."""


class RequestCancelled(MineDraftError):
    """The call was cancelled, by the caller or the server."""


_ERROR_TYPES: dict[grpc.StatusCode, type[MineDraftError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidRequest,
    grpc.StatusCode.OUT_OF_RANGE: InvalidRequest,
    grpc.StatusCode.FAILED_PRECONDITION: InvalidRequest,
    grpc.StatusCode.UNAVAILABLE: ServerUnavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: RequestTimeout,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.CANCELLED: RequestCancelled,
}


def error_from_rpc(error: grpc.RpcError) -> MineDraftError:
    """Map a failed sync or asyncio call to the matching MineDraftError subclass."""
    code_fn = getattr(error, "code", None)
    details_fn = getattr(error, "details", None)
    code = code_fn() if callable(code_fn) else None
    if not isinstance(code, grpc.StatusCode):
        code = grpc.StatusCode.UNKNOWN
    message = (details_fn() if callable(details_fn) else None) or str(error)
    return _ERROR_TYPES.get(code, MineDraftError)(code, message)


# --------------------------------------------------------------------------- requests

def build_request(prompt: str | Sequence[int], *, max_tokens: int, temperature: float,
                  top_p: float, top_k: int, stop: str | Sequence[str] | None,
                  stop_token_ids: Sequence[int] | None, ignore_eos: bool, seed: int | None,
                  request_id: str) -> generation_pb2.GenerateRequest:
    """One place that turns keyword arguments into the wire message (validation is the server's)."""
    if isinstance(stop, str):  # a lone string would otherwise become one stop per character
        stop = [stop]
    sampling = generation_pb2.SamplingOptions(
        temperature=temperature, top_p=top_p, top_k=top_k, max_tokens=max_tokens,
        stop_token_ids=list(stop_token_ids or ()), stop=list(stop or ()), ignore_eos=ignore_eos)
    if seed is not None:  # unset lets the server choose; 0 is a real seed
        sampling.seed = seed
    request = generation_pb2.GenerateRequest(sampling=sampling, request_id=request_id)
    if isinstance(prompt, str):
        request.prompt = prompt
    else:
        request.prompt_token_ids.extend(prompt)
    return request


def message_to_dict(message: Message) -> dict[str, Any]:
    """Flat message -> dict of native Python values (json_format would turn uint64 into str)."""
    return {field.name: getattr(message, field.name) for field in message.DESCRIPTOR.fields}


# --------------------------------------------------------------------------- streams

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


# --------------------------------------------------------------------------- clients

class Client:
    """Blocking client; one channel, safe to share between threads."""

    def __init__(self, target: str = DEFAULT_TARGET, timeout: float | None = 60.0) -> None:
        self.target = target
        self.timeout = timeout
        self._channel = grpc.insecure_channel(target)
        self._stub = generation_pb2_grpc.GenerationStub(self._channel)

    def _timeout(self, timeout: Timeout) -> float | None:
        return self.timeout if timeout is CLIENT_TIMEOUT else timeout

    def wait_ready(self, timeout: float | None = None) -> None:
        """Block until the channel connects, so start-up scripts fail fast with a clear error."""
        ready = grpc.channel_ready_future(self._channel)
        try:
            ready.result(timeout=timeout)
        except grpc.FutureTimeoutError:
            ready.cancel()
            raise ServerUnavailable(grpc.StatusCode.UNAVAILABLE,
                                    f"server at {self.target} not ready after {timeout}s") from None

    def generate(self, prompt: str | Sequence[int], *, max_tokens: int = 64,
                 temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
                 stop: str | Sequence[str] | None = None,
                 stop_token_ids: Sequence[int] | None = None, ignore_eos: bool = False,
                 seed: int | None = None, request_id: str = "",
                 timeout: Timeout = CLIENT_TIMEOUT) -> GenerationResult:
        """Generate a completion and wait for all of it."""
        request = build_request(prompt, max_tokens=max_tokens, temperature=temperature,
                                top_p=top_p, top_k=top_k, stop=stop,
                                stop_token_ids=stop_token_ids, ignore_eos=ignore_eos, seed=seed,
                                request_id=request_id)
        try:
            response = self._stub.Generate(request, timeout=self._timeout(timeout))
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None
        return GenerationResult.from_proto(response)

    def stream(self, prompt: str | Sequence[int], *, max_tokens: int = 64,
               temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
               stop: str | Sequence[str] | None = None,
               stop_token_ids: Sequence[int] | None = None, ignore_eos: bool = False,
               seed: int | None = None, request_id: str = "",
               timeout: Timeout = CLIENT_TIMEOUT) -> ChunkStream:
        """Generate a completion chunk by chunk; stop iterating to cancel it."""
        request = build_request(prompt, max_tokens=max_tokens, temperature=temperature,
                                top_p=top_p, top_k=top_k, stop=stop,
                                stop_token_ids=stop_token_ids, ignore_eos=ignore_eos, seed=seed,
                                request_id=request_id)
        return ChunkStream(self._stub.GenerateStream(request, timeout=self._timeout(timeout)))

    def server_info(self, timeout: Timeout = CLIENT_TIMEOUT) -> dict[str, Any]:
        """Mode, k, models and batch size the server runs with."""
        try:
            info = self._stub.GetServerInfo(generation_pb2.ServerInfoRequest(),
                                            timeout=self._timeout(timeout))
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None
        return message_to_dict(info)

    def step_stats(self, max_steps: int = 0, timeout: Timeout = CLIENT_TIMEOUT) -> list[dict[str, Any]]:
        """Recent per-step timings (0 = as many as the server keeps)."""
        try:
            stats = self._stub.GetStepStats(generation_pb2.StepStatsRequest(max_steps=max_steps),
                                            timeout=self._timeout(timeout))
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None
        return [message_to_dict(step) for step in stats.steps]

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class AsyncClient:
    """asyncio client; create and use it inside one running event loop."""

    def __init__(self, target: str = DEFAULT_TARGET, timeout: float | None = 60.0) -> None:
        self.target = target
        self.timeout = timeout
        self._channel = grpc.aio.insecure_channel(target)
        self._stub = generation_pb2_grpc.GenerationStub(self._channel)

    def _timeout(self, timeout: Timeout) -> float | None:
        return self.timeout if timeout is CLIENT_TIMEOUT else timeout

    async def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until the channel connects, so start-up scripts fail fast with a clear error."""
        try:
            await asyncio.wait_for(self._channel.channel_ready(), timeout)
        except asyncio.TimeoutError:
            raise ServerUnavailable(grpc.StatusCode.UNAVAILABLE,
                                    f"server at {self.target} not ready after {timeout}s") from None

    async def generate(self, prompt: str | Sequence[int], *, max_tokens: int = 64,
                       temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
                       stop: str | Sequence[str] | None = None,
                       stop_token_ids: Sequence[int] | None = None, ignore_eos: bool = False,
                       seed: int | None = None, request_id: str = "",
                       timeout: Timeout = CLIENT_TIMEOUT) -> GenerationResult:
        """Generate a completion and wait for all of it."""
        request = build_request(prompt, max_tokens=max_tokens, temperature=temperature,
                                top_p=top_p, top_k=top_k, stop=stop,
                                stop_token_ids=stop_token_ids, ignore_eos=ignore_eos, seed=seed,
                                request_id=request_id)
        try:
            response = await self._stub.Generate(request, timeout=self._timeout(timeout))
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None
        return GenerationResult.from_proto(response)

    def stream(self, prompt: str | Sequence[int], *, max_tokens: int = 64,
               temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
               stop: str | Sequence[str] | None = None,
               stop_token_ids: Sequence[int] | None = None, ignore_eos: bool = False,
               seed: int | None = None, request_id: str = "",
               timeout: Timeout = CLIENT_TIMEOUT) -> AsyncChunkStream:
        """Generate chunk by chunk (``async for``); stop iterating to cancel it."""
        request = build_request(prompt, max_tokens=max_tokens, temperature=temperature,
                                top_p=top_p, top_k=top_k, stop=stop,
                                stop_token_ids=stop_token_ids, ignore_eos=ignore_eos, seed=seed,
                                request_id=request_id)
        return AsyncChunkStream(self._stub.GenerateStream(request, timeout=self._timeout(timeout)))

    async def server_info(self, timeout: Timeout = CLIENT_TIMEOUT) -> dict[str, Any]:
        """Mode, k, models and batch size the server runs with."""
        try:
            info = await self._stub.GetServerInfo(generation_pb2.ServerInfoRequest(),
                                                  timeout=self._timeout(timeout))
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None
        return message_to_dict(info)

    async def step_stats(self, max_steps: int = 0,
                         timeout: Timeout = CLIENT_TIMEOUT) -> list[dict[str, Any]]:
        """Recent per-step timings (0 = as many as the server keeps)."""
        try:
            stats = await self._stub.GetStepStats(
                generation_pb2.StepStatsRequest(max_steps=max_steps), timeout=self._timeout(timeout))
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None
        return [message_to_dict(step) for step in stats.steps]

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
