"""Prometheus metrics of the gateway, defined once here.

The HTTP front end serves `exposition()` at GET /metrics; `serve_metrics` serves the same
on a port of its own (--metrics-port) for deployments without the HTTP front end.
"""

from __future__ import annotations

import asyncio
import contextlib

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route


def exposition() -> tuple[bytes, str]:
    """The current metrics in the Prometheus text format, and its content type."""
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST


async def metrics_endpoint(request: Request) -> Response:
    body, content_type = exposition()
    return Response(body, media_type=content_type)


class EmbeddedServer(uvicorn.Server):
    """A uvicorn server inside a process that handles its own signals (the gateway drains on
    SIGTERM): uvicorn must not take SIGINT/SIGTERM over while it runs."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


async def start_embedded(app, host: str, port: int) -> tuple[EmbeddedServer, asyncio.Task]:
    """Start `app` on host:port in the running loop; returns once it listens."""
    server = EmbeddedServer(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()            # raises why it could not start (port in use, ...)
            raise RuntimeError(f"HTTP server on {host}:{port} ended before it started")
        await asyncio.sleep(0.01)
    return server, task


class MetricsServer:
    """GET /metrics on a port of its own; `close()` stops it."""

    def __init__(self, server: uvicorn.Server, task: asyncio.Task) -> None:
        self.server = server
        self.task = task

    @property
    def port(self) -> int:
        return self.server.servers[0].sockets[0].getsockname()[1]

    async def close(self) -> None:
        self.server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


async def serve_metrics(host: str, port: int) -> MetricsServer:
    server, task = await start_embedded(Starlette(routes=[Route("/metrics", metrics_endpoint)]), host, port)
    return MetricsServer(server, task)
