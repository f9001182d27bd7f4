"""The OpenAI-compatible routes, over the same front end as the gRPC API (gateway/frontend.py):

  POST /v1/completions, POST /v1/chat/completions   generation, whole or streamed (SSE)
  GET  /v1/models                                   the one model served
  GET  /health                                      200 while serving; 503 while the engine is down or draining
  GET  /metrics                                     Prometheus (gateway/metrics.py)

/v1/ routes need an API key when the gateway has any; /health and /metrics stay open, as the
gRPC health service does, for orchestrators and scrapers.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import aclosing
from dataclasses import dataclass, field

import grpc
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from gateway import metrics
from gateway.frontend import Frontend, RequestError
from gateway.http.auth import ApiKeys
from gateway.http.chat_template import ChatTemplate
from gateway.http.errors import error_body, error_response, http_error
from gateway.http.openai_request import OpenAIRequest, chat_request, completion_request
from gateway.http.openai_response import DONE, ChatCompletion, Completion, sse, usage
from gateway.request import ActiveRequest
from minedraft.constants import MAX_REQUEST_BYTES

@dataclass(frozen=True)
class ServedModel:
    name: str                       # what /v1/models lists and requests name
    path: str                       # the model directory; requests may name it too
    max_model_len: int
    created: int = field(default_factory=lambda: int(time.time()))

    def serves(self, model: str | None) -> bool:
        return model is None or model in (self.name, self.path)


class EventStream(StreamingResponse):
    """Server-sent events whose request is released however the response ends, also when the
    client leaves before the first event is sent (the body's generator never started then)."""

    def __init__(self, content: AsyncIterator[bytes], release: Callable[[], None]) -> None:
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()


async def _json_body(request: Request) -> dict:
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_REQUEST_BYTES:
            raise RequestError(grpc.StatusCode.INVALID_ARGUMENT,
                               f"request body: larger than {MAX_REQUEST_BYTES} bytes")
    try:
        value = json.loads(body)
    except ValueError as err:
        raise RequestError(grpc.StatusCode.INVALID_ARGUMENT, f"request body: not valid JSON ({err})") from None
    if not isinstance(value, dict):
        raise RequestError(grpc.StatusCode.INVALID_ARGUMENT, "request body: must be a JSON object")
    return value


async def _disconnected(request: Request) -> None:
    """Returns when the client has gone (its body already read, only a disconnect can come)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class OpenAIRoutes:
    def __init__(self, frontend: Frontend, model: ServedModel, chat_template: ChatTemplate | None,
                 api_keys: ApiKeys) -> None:
        self.frontend = frontend
        self.model = model
        self.chat_template = chat_template
        self.api_keys = api_keys

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, completion_request, Completion)

    async def chat_completions(self, request: Request) -> Response:
        return await self._generate(request, lambda body: chat_request(body, self.chat_template), ChatCompletion)

    async def _generate(self, request: Request, parse: Callable[[dict], OpenAIRequest],
                        shape: type[Completion]) -> Response:
        names: Mapping[str, str] = {}
        try:
            self.api_keys.check(request.headers.get("authorization"))
            parsed = parse(await _json_body(request))
            names = parsed.names
            if not self.model.serves(parsed.model):
                raise RequestError(grpc.StatusCode.NOT_FOUND, f"model: {parsed.model!r} is not served here; "
                                   f"this server serves {self.model.name!r}", "model")
            req = await self.frontend.build(parsed.generation)
            self.frontend.submit(req)
        except RequestError as err:
            return error_response(err, names)
        answer = shape(parsed.generation.client_id, self.model.name, int(time.time()))
        if parsed.stream:
            return EventStream(self._stream(req, answer, parsed.include_usage, names),
                               release=lambda: self.frontend.release(req))
        return await self._whole(request, req, answer, names)

    async def _collect(self, req: ActiveRequest) -> tuple[str, str | None]:
        text, finish_reason = [], None
        async with aclosing(self.frontend.events(req)) as events:
            async for event in events:
                text.append(event.text)
                finish_reason = event.finish_reason or finish_reason
        return "".join(text), finish_reason

    async def _whole(self, request: Request, req: ActiveRequest, answer: Completion,
                     names: Mapping[str, str]) -> Response:
        """The whole completion; a client that leaves first stops its request."""
        collect = asyncio.ensure_future(self._collect(req))
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            done, _ = await asyncio.wait((collect, gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not collect.done():
                collect.cancel()
                self.frontend.release(req)
        if collect not in done:
            return Response(status_code=499)       # nobody is listening
        try:
            text, finish_reason = collect.result()
        except RequestError as err:
            return error_response(err, names)
        return JSONResponse(answer.whole(text, finish_reason, usage(req)))

    async def _stream(self, req: ActiveRequest, answer: Completion, include_usage: bool,
                      names: Mapping[str, str]) -> AsyncIterator[bytes]:
        def event(chunk: dict) -> bytes:
            return sse({**chunk, "usage": None} if include_usage else chunk)

        for chunk in answer.opening():
            yield event(chunk)
        try:
            async with aclosing(self.frontend.events(req)) as events:
                async for update in events:
                    if update.text:
                        yield event(answer.chunk(update.text))
                    if update.finish_reason is not None:
                        yield event(answer.chunk("", update.finish_reason))
        except RequestError as err:          # after the 200: the error travels as an event
            yield sse(http_error(err, names)[1])
            yield DONE
            return
        if include_usage:
            yield sse(answer.usage_chunk(usage(req)))
        yield DONE

    async def models(self, request: Request) -> Response:
        try:
            self.api_keys.check(request.headers.get("authorization"))
        except RequestError as err:
            return error_response(err)
        return JSONResponse({"object": "list", "data": [
            {"id": self.model.name, "object": "model", "created": self.model.created, "owned_by": "minedraft",
             "root": self.model.path, "max_model_len": self.model.max_model_len}]})

    async def health(self, request: Request) -> Response:
        unavailable = self.frontend.manager.unavailable
        if unavailable:
            return error_response(RequestError(grpc.StatusCode.UNAVAILABLE, unavailable))
        return JSONResponse({"status": "serving"})


async def _http_exception(request: Request, exc: HTTPException) -> Response:
    """Unknown routes and methods, in OpenAI's error body too."""
    return JSONResponse(error_body(f"{request.method} {request.url.path}: {exc.detail}", "invalid_request_error",
                                   code=str(exc.status_code)), status_code=exc.status_code)


async def _server_error(request: Request, exc: Exception) -> Response:
    """A bug: uvicorn logs the traceback; the client gets OpenAI's error body."""
    return JSONResponse(error_body("internal error", "server_error", code="internal"), status_code=500)


def create_app(frontend: Frontend, model: ServedModel, chat_template: ChatTemplate | None,
               api_keys: ApiKeys) -> Starlette:
    routes = OpenAIRoutes(frontend, model, chat_template, api_keys)
    return Starlette(routes=[
        Route("/v1/completions", routes.completions, methods=["POST"]),
        Route("/v1/chat/completions", routes.chat_completions, methods=["POST"]),
        Route("/v1/models", routes.models, methods=["GET"]),
        Route("/health", routes.health, methods=["GET"]),
        Route("/metrics", metrics.metrics_endpoint, methods=["GET"]),
    ], exception_handlers={HTTPException: _http_exception, Exception: _server_error})
