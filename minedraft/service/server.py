"""A service's gRPC server with the standard health service, and waiting for a peer's."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from minedraft.constants import MAX_MESSAGE_BYTES

MESSAGE_SIZE_OPTIONS = [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]


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

    port 0 binds any free port; port_file then tells a launcher which one, once serving
    (choosing a free port for a child ahead of time races with every other bind on the host).
    credentials: TLS for the port (None: plaintext); max_receive_bytes: the largest request
    accepted (larger ones are refused with RESOURCE_EXHAUSTED before any handler runs)."""
    server = grpc.aio.server(interceptors=list(interceptors),
                             options=[("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                                      ("grpc.max_receive_message_length", max_receive_bytes)])
    add_servicers(server)
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


async def wait_healthy(address: str, timeout_s: float) -> None:
    """Poll a service's health endpoint until it reports SERVING."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    async with grpc.aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            try:
                reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2.0)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.aio.AioRpcError:
                pass
            if loop.time() > deadline:
                raise TimeoutError(f"{address} not healthy after {timeout_s:.0f} s")
            await asyncio.sleep(0.2)
