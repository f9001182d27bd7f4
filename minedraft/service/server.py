"""A service's gRPC server with the standard health service, and waiting for a peer's."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from minedraft.constants import MAX_MESSAGE_BYTES
from minedraft.service.backoff import RECONNECT_OPTIONS, Backoff
from minedraft.service.security import DialSecurity

MESSAGE_SIZE_OPTIONS = [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]


class _Malformed:
    """What a request that is not valid protobuf deserialises to, so the handler can refuse
    it with INVALID_ARGUMENT instead of gRPC answering UNKNOWN and logging a traceback."""

    def __init__(self, error: Exception) -> None:
        self.error = error


def _tolerant(deserializer: Callable[[bytes], object]) -> Callable[[bytes], object]:
    def deserialize(data: bytes) -> object:
        try:
            return deserializer(data)
        except DecodeError as err:
            return _Malformed(err)
    return deserialize


async def _refuse(context: grpc.aio.ServicerContext, request: _Malformed) -> None:
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"request: not a valid protobuf message ({request.error})")


def _refusing_malformed(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """The same handler, refusing malformed requests first (unary requests only)."""
    if handler.request_streaming or handler.request_deserializer is None:
        return handler
    if handler.response_streaming:
        behavior = handler.unary_stream

        async def unary_stream(request, context):
            if isinstance(request, _Malformed):
                await _refuse(context, request)
            async for response in behavior(request, context):
                yield response
        return handler._replace(request_deserializer=_tolerant(handler.request_deserializer),
                                unary_stream=unary_stream)
    behavior = handler.unary_unary

    async def unary_unary(request, context):
        if isinstance(request, _Malformed):
            await _refuse(context, request)
        return await behavior(request, context)
    return handler._replace(request_deserializer=_tolerant(handler.request_deserializer), unary_unary=unary_unary)


class _HandlerCapture:
    """Stands in for the server while generated `add_*Servicer_to_server` functions run, so
    their handlers can be wrapped before the real server gets them."""

    def __init__(self) -> None:
        self.services: dict[str, dict[str, grpc.RpcMethodHandler]] = {}

    def add_generic_rpc_handlers(self, handlers) -> None:
        pass                                # the same handlers come again, registered by name

    def add_registered_method_handlers(self, service: str, handlers: dict) -> None:
        self.services[service] = handlers


@dataclass
class Served:
    """A started server: the port it bound and its health, which the service keeps true."""

    server: grpc.aio.Server
    port: int
    health: health.aio.HealthServicer
    service_names: tuple[str, ...]

    async def set_serving(self, serving: bool) -> None:
        """Every service name and the server as a whole ("") turn SERVING or NOT_SERVING."""
        status = (health_pb2.HealthCheckResponse.SERVING if serving
                  else health_pb2.HealthCheckResponse.NOT_SERVING)
        for name in ("", *self.service_names):
            await self.health.set(name, status)


async def start_server(add_servicers: Callable[[grpc.aio.Server], None], host: str, port: int,
                       service_names: list[str], port_file: str = "", *,
                       credentials: grpc.ServerCredentials | None = None,
                       interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
                       max_receive_bytes: int = MAX_MESSAGE_BYTES) -> Served:
    """Start a grpc.aio server with the standard health service, SERVING once started.
    Every unary request that is not valid protobuf is refused with INVALID_ARGUMENT.

    port 0 binds any free port; port_file then tells a launcher which one, once serving
    (choosing a free port for a child ahead of time races with every other bind on the host).
    credentials: TLS for the port (None: plaintext); max_receive_bytes: the largest request
    accepted (larger ones are refused with RESOURCE_EXHAUSTED before any handler runs)."""
    server = grpc.aio.server(interceptors=list(interceptors),
                             options=[("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                                      ("grpc.max_receive_message_length", max_receive_bytes)])
    capture = _HandlerCapture()
    add_servicers(capture)
    for service, handlers in capture.services.items():
        wrapped = {name: _refusing_malformed(handler) for name, handler in handlers.items()}
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, wrapped),))
        server.add_registered_method_handlers(service, wrapped)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    address = f"{host}:{port}"
    bound = (server.add_secure_port(address, credentials) if credentials is not None
             else server.add_insecure_port(address))
    if bound == 0:
        raise OSError(f"cannot bind {address}")
    await server.start()
    served = Served(server, bound, health_servicer, tuple(service_names))
    await served.set_serving(True)
    if port_file:
        partial = f"{port_file}.partial"
        with open(partial, "w") as f:
            f.write(str(bound))
        os.replace(partial, port_file)          # readers never see a half-written file
    return served


async def wait_healthy(address: str, timeout_s: float, dial: DialSecurity | None = None) -> None:
    """Return once a service reports SERVING (over TLS with `dial`'s); TimeoutError after timeout_s.

    Nothing here polls: the health Watch stream waits for the channel to connect (gRPC's
    reconnect backoff) and then pushes every change of status. Only a stream that ends or
    fails (the service stopped while starting) is opened again, after a backoff."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    retries = Backoff(initial_s=0.1, max_s=2.0).delays()
    async with (dial or DialSecurity()).aio_channel(address, options=RECONNECT_OPTIONS) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while (remaining := deadline - loop.time()) > 0:
            try:
                if await _watch_until_serving(stub, remaining):
                    return
            except grpc.aio.AioRpcError as err:
                if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                    break
            await asyncio.sleep(min(next(retries), max(0.0, deadline - loop.time())))
    raise TimeoutError(f"{address} not healthy after {timeout_s:.0f} s")


async def _watch_until_serving(stub: health_pb2_grpc.HealthStub, timeout_s: float) -> bool:
    """Whether the server turned SERVING before its Watch stream ended; a server without Watch
    (only Check, as some proxies have) is asked once."""
    request = health_pb2.HealthCheckRequest(service="")
    try:
        async for reply in stub.Watch(request, timeout=timeout_s, wait_for_ready=True):
            if reply.status == health_pb2.HealthCheckResponse.SERVING:
                return True
        return False
    except grpc.aio.AioRpcError as err:
        if err.code() != grpc.StatusCode.UNIMPLEMENTED:
            raise
    reply = await stub.Check(request, timeout=timeout_s, wait_for_ready=True)
    return reply.status == health_pb2.HealthCheckResponse.SERVING
