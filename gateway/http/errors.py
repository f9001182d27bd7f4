"""Refusals in OpenAI's error body, `{"error": {"message", "type", "param", "code"}}`, with the
HTTP status each gRPC category maps to. `param` is the field as the OpenAI API names it."""

from __future__ import annotations

from collections.abc import Mapping

import grpc
from starlette.responses import JSONResponse

from gateway.frontend import RequestError

# gRPC category -> (HTTP status, OpenAI error type)
_HTTP = {
    grpc.StatusCode.INVALID_ARGUMENT: (400, "invalid_request_error"),
    grpc.StatusCode.UNAUTHENTICATED: (401, "authentication_error"),
    grpc.StatusCode.PERMISSION_DENIED: (403, "permission_error"),
    grpc.StatusCode.NOT_FOUND: (404, "not_found_error"),
    grpc.StatusCode.RESOURCE_EXHAUSTED: (429, "rate_limit_error"),
    grpc.StatusCode.UNAVAILABLE: (503, "service_unavailable_error"),
    grpc.StatusCode.DEADLINE_EXCEEDED: (504, "timeout_error"),
}
_SERVER_ERROR = (500, "server_error")
# What OpenAI's clients look for; every other error's code is its gRPC status, in lower case.
_CODES = {grpc.StatusCode.UNAUTHENTICATED: "invalid_api_key"}


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def http_error(err: RequestError, names: Mapping[str, str] = {}) -> tuple[int, dict]:
    """(HTTP status, body). `names` renames the front end's fields (the gRPC API's spelling,
    "sampling.top_p") to the OpenAI API's ("top_p"), in `param` and at the message's start."""
    status, kind = _HTTP.get(err.code, _SERVER_ERROR)
    param, message = err.field, err.message
    if err.field is not None:
        param = names.get(err.field, err.field)
        if message.startswith(err.field):
            message = param + message[len(err.field):]
    return status, error_body(message, kind, param, _CODES.get(err.code, err.code.name.lower()))


def error_response(err: RequestError, names: Mapping[str, str] = {}) -> JSONResponse:
    status, body = http_error(err, names)
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(body, status_code=status, headers=headers)
