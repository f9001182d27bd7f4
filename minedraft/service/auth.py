"""Bearer-token authentication on gRPC: the server interceptor that demands a token, the
client interceptors that present one (also over plaintext, where gRPC refuses call
credentials), and the challenge by which a service proves it holds the deployment's internal
token before anyone sends it that token. Configuration lives in `security.py`."""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

HEALTH_PREFIX = "/grpc.health.v1.Health/"        # open without a token, so orchestrators can probe
CHALLENGE_HEADER = "x-minedraft-challenge"       # a dialer's nonce, on a health check
PROOF_HEADER = "x-minedraft-proof"               # membership_proof(token, nonce), in the answer


def membership_proof(token: str, nonce: str) -> str:
    """A service's answer to a challenge: shows it knows the token without revealing it."""
    return hmac.new(token.encode(), b"minedraft-member\0" + nonce.encode(), "sha256").hexdigest()


def _is_health(method: str | bytes) -> bool:
    return (method.decode() if isinstance(method, bytes) else method).startswith(HEALTH_PREFIX)


class BearerTokenInterceptor(grpc.aio.ServerInterceptor):
    """Serves a call only with `authorization: Bearer <token>` naming one of `tokens` (compared
    in constant time), else UNAUTHENTICATED. Health checks stay open; with `internal`, one that
    carries a challenge is answered with membership_proof in its initial metadata."""

    def __init__(self, tokens: Sequence[str], *, internal: bool = False) -> None:
        self._tokens = tuple(token.encode() for token in tokens)
        self._kind = "internal token" if internal else "API key"
        self._proof_token = tokens[0] if internal else ""

    def _refusal(self, metadata: Sequence[tuple[str, Any]]) -> str | None:
        values = [str(value) for key, value in metadata if key == "authorization"]
        if not values:
            return f"missing {self._kind}: send metadata 'authorization: Bearer <key>'"
        scheme, _, presented = values[0].partition(" ")
        matched = False
        for token in self._tokens:      # no early exit: the time taken says nothing about which
            matched |= hmac.compare_digest(presented.strip().encode(), token)
        return None if matched and scheme.lower() == "bearer" else f"{self._kind} not accepted"

    async def intercept_service(
            self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
            details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        metadata = details.invocation_metadata or ()
        if _is_health(details.method):
            nonce = next((str(value) for key, value in metadata if key == CHALLENGE_HEADER), "")
            if nonce and self._proof_token and handler is not None and handler.unary_unary:
                return _answering(handler, membership_proof(self._proof_token, nonce))
            return handler
        refusal = self._refusal(metadata)
        return handler if refusal is None else _refusing(handler, refusal)


def _answering(handler: grpc.RpcMethodHandler, proof: str) -> grpc.RpcMethodHandler:
    async def answer(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.send_initial_metadata(((PROOF_HEADER, proof),))
        return await handler.unary_unary(request, context)

    return grpc.unary_unary_rpc_method_handler(answer, handler.request_deserializer,
                                               handler.response_serializer)


def _refusing(handler: grpc.RpcMethodHandler | None, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same kind as `handler` (unary or streaming) that aborts UNAUTHENTICATED."""
    async def refuse(request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    kinds = [("stream" if streaming else "unary") for streaming in
             ((handler.request_streaming, handler.response_streaming) if handler else (False, False))]
    return getattr(grpc, f"{kinds[0]}_{kinds[1]}_rpc_method_handler")(refuse)


def _with_token(details: Any, metadata: tuple[tuple[str, str], ...]) -> Any:
    """The call's details with the token added, except on health checks."""
    if _is_health(details.method):
        return details
    return grpc.aio.ClientCallDetails(details.method, details.timeout,  # sync reads it too
                                      (*(details.metadata or ()), *metadata),
                                      details.credentials, details.wait_for_ready)


class SyncBearer(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                  grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds the token to blocking calls; also in plaintext, where gRPC refuses call credentials."""

    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._metadata = metadata

    def _intercept(self, continuation: Callable[..., Any], details: Any, request: Any) -> Any:
        return continuation(_with_token(details, self._metadata), request)

    intercept_unary_unary = intercept_unary_stream = _intercept
    intercept_stream_unary = intercept_stream_stream = _intercept


class _AioBearer:
    """SyncBearer for asyncio channels."""

    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._metadata = metadata

    async def _intercept(self, continuation: Callable[..., Any], details: Any, request: Any) -> Any:
        return await continuation(_with_token(details, self._metadata), request)

    intercept_unary_unary = intercept_unary_stream = _intercept
    intercept_stream_unary = intercept_stream_stream = _intercept


# A grpc.aio channel files an interceptor under the first kind it is an instance of: one per kind.
AIO_BEARERS = [type(f"_AioBearer{kind.__name__}", (_AioBearer, kind), {}) for kind in (
    grpc.aio.UnaryUnaryClientInterceptor, grpc.aio.UnaryStreamClientInterceptor,
    grpc.aio.StreamUnaryClientInterceptor, grpc.aio.StreamStreamClientInterceptor)]


async def proves_membership(channel: grpc.aio.Channel, token: str, timeout: float) -> bool:
    """Whether the server behind `channel` knows the internal token; ask before sending it one.

    A health check (which carries no token) sends a fresh nonce; a service of this deployment
    answers with its membership_proof. Any failure is False, so callers report one error."""
    nonce = secrets.token_hex(16)
    call = health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(), metadata=((CHALLENGE_HEADER, nonce),), timeout=timeout)
    try:
        await call
        answer = next((str(v) for k, v in await call.initial_metadata() if k == PROOF_HEADER), "")
    except grpc.aio.AioRpcError:
        return False
    return hmac.compare_digest(answer.encode(), membership_proof(token, nonce).encode())
