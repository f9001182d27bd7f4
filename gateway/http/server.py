"""The gateway's HTTP servers: uvicorn on the gateway's own event loop, leaving SIGTERM to the
gateway's drain. The OpenAI-compatible front end, with the public API's TLS certificate (and
its client CA for mTLS when the gRPC port demands client certificates), and the metrics alone
on a port of their own (--metrics-port)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.routing import Route

from gateway.frontend import Frontend
from gateway.http.app import ServedModel, create_app
from gateway.http.auth import ApiKeys
from gateway.http.chat_template import ChatTemplate
from gateway.metrics import metrics_endpoint
from minedraft.service.security import ServerSecurity


def tls_options(security: ServerSecurity) -> dict[str, Any]:
    """uvicorn's TLS settings for the public API's certificate (none: plaintext)."""
    if not security.tls:
        return {}
    options: dict[str, Any] = {"ssl_certfile": security.cert_file, "ssl_keyfile": security.key_file}
    if security.client_ca_file:
        options.update(ssl_ca_certs=security.client_ca_file, ssl_cert_reqs=ssl.CERT_REQUIRED)
    return options


class EmbeddedServer(uvicorn.Server):
    """A uvicorn server inside a process that handles its own signals (the gateway drains on
    SIGTERM): uvicorn must not take SIGINT/SIGTERM over while it runs."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


async def start_embedded(app, host: str, port: int, **options) -> tuple[EmbeddedServer, asyncio.Task]:
    """Start `app` on host:port in the running loop; returns once it listens."""
    server = EmbeddedServer(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off", **options))
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()            # raises why it could not start (port in use, ...)
            raise RuntimeError(f"HTTP server on {host}:{port} ended before it started")
        await asyncio.sleep(0.01)
    return server, task


class HttpServer:
    """A started embedded HTTP server (the front end or the metrics); `close()` stops it."""

    def __init__(self, server: uvicorn.Server, task: asyncio.Task, host: str, tls: bool) -> None:
        self.server = server
        self.task = task
        self.host = host
        self.tls = tls

    @property
    def port(self) -> int:
        return self.server.servers[0].sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"

    async def close(self, timeout_s: float = 5.0) -> None:
        """Stop accepting; connections still open after timeout_s are cut."""
        self.server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self.task), timeout_s)
        except asyncio.TimeoutError:
            self.server.force_exit = True
            with contextlib.suppress(asyncio.CancelledError):
                await self.task


async def start_http(app: Starlette, host: str, port: int, security: ServerSecurity,
                     port_file: str = "") -> HttpServer:
    """Serve `app` on host:port (0: any free port, then named in port_file once serving)."""
    server, task = await start_embedded(app, host, port, **tls_options(security))
    served = HttpServer(server, task, host, security.tls)
    if port_file:
        partial = f"{port_file}.partial"
        with open(partial, "w") as f:
            f.write(str(served.port))
        os.replace(partial, port_file)          # readers never see a half-written file
    return served


async def serve_openai(frontend: Frontend, model_path: str, tokenizer_dir: str, model_name: str, host: str,
                       port: int, security: ServerSecurity, port_file: str = "") -> HttpServer:
    """The OpenAI-compatible API of the model at model_path, listed as model_name (default: the
    directory's name), with the chat template of tokenizer_dir and the public API's keys and TLS."""
    model = ServedModel(model_name or Path(model_path).name, model_path, frontend.max_model_len)
    app = create_app(frontend, model, ChatTemplate.from_model_dir(tokenizer_dir), ApiKeys(security.tokens))
    return await start_http(app, host, port, security, port_file)


async def serve_metrics(host: str, port: int) -> HttpServer:
    """GET /metrics alone, on a port of its own (no TLS or keys: keep it on a private network)."""
    server, task = await start_embedded(Starlette(routes=[Route("/metrics", metrics_endpoint)]), host, port)
    return HttpServer(server, task, host, tls=False)
