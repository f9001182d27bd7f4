"""Failures as typed exceptions, so callers never touch grpc status objects."""

from __future__ import annotations

import grpc


class MineDraftError(Exception):
    """A failed call; `code` is the gRPC status and `message` the server's explanation."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


class InvalidRequest(MineDraftError):
    """The request was rejected as it stands; retrying it unchanged will fail again."""


class NotFound(MineDraftError):
    """The request names something the server does not have (e.g. a drafter not in the pool)."""


class ServerUnavailable(MineDraftError):
    """The server could not be reached or is shutting down; retrying later may succeed."""


class Unauthenticated(MineDraftError):
    """The server wants credentials: an API key (api_key=) or a client certificate it accepts."""


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
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.UNAVAILABLE: ServerUnavailable,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: Unauthenticated,
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
