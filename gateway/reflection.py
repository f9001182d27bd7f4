"""gRPC server reflection for the public port, so grpcurl and other generic tools can list
and call the public services without the .proto files."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc

from minedraft.v1 import generation_pb2

PUBLIC_SERVICES = (generation_pb2.DESCRIPTOR.services_by_name["Generation"].full_name,
                   health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                   reflection.SERVICE_NAME)


def add_reflection(server: grpc.aio.Server) -> None:
    """Serve reflection for the public services (the server may be start_server's stand-in,
    so the asyncio servicer is added directly rather than through enable_server_reflection)."""
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(
        reflection.aio.ReflectionServicer(PUBLIC_SERVICES), server)
