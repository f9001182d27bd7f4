"""A service's gRPC server with the standard health service, and waiting for a peer's."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from minedraft.constants import MAX_MESSAGE_BYTES

MESSAGE_SIZE_OPTIONS = [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]


async def start_server(add_servicers: Callable[[grpc.aio.Server], None], host: str, port: int,
                       service_names: list[str], port_file: str = "") -> tuple[grpc.aio.Server, int]:
    """Start a grpc.aio server with the standard health service; -> (server, bound port).

    port 0 binds any free port; port_file then tells a launcher which one, once serving
    (choosing a free port for a child ahead of time races with every other bind on the host)."""
    server = grpc.aio.server(options=MESSAGE_SIZE_OPTIONS)
    add_servicers(server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot bind {host}:{port}")
    await server.start()
    for name in ["", *service_names]:
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    if port_file:
        partial = f"{port_file}.partial"
        with open(partial, "w") as f:
            f.write(str(bound))
        os.replace(partial, port_file)          # readers never see a half-written file
    return server, bound


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
