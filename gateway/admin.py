"""The drafter pool's admin API (register, deregister, list), served on the gateway's admin
port: loopback by default, never the public port, so no client of the public API can list,
remove or add drafters (or make the gateway dial addresses of its choosing)."""

from __future__ import annotations

import grpc

from gateway.batch_manager import BatchManager
from gateway.pool import PoolError
from minedraft.v1 import generation_pb2, generation_pb2_grpc

REGISTER_TIMEOUT_S = 10.0


class DrafterPoolServicer(generation_pb2_grpc.DrafterPoolServicer):
    """Drafters join and leave the pool at run time."""

    def __init__(self, manager: BatchManager) -> None:
        self.manager = manager

    async def Register(self, request: generation_pb2.DrafterEndpoint, context) -> generation_pb2.PoolStatus:
        if self.manager.pool is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "this gateway runs in ar mode: no drafters")
        try:
            # A drafter that registers is already serving: it answers at once or not at all.
            await self.manager.add_drafter(request.address, timeout_s=REGISTER_TIMEOUT_S)
        except PoolError as err:
            await context.abort(err.code, str(err))
        return self.manager.pool.status()

    async def Deregister(self, request: generation_pb2.DrafterEndpoint, context) -> generation_pb2.PoolStatus:
        if self.manager.pool is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "this gateway runs in ar mode: no drafters")
        if self.manager.remove_drafter(request.address) is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"address: {request.address!r} is not in the pool")
        return self.manager.pool.status()

    async def List(self, request, context) -> generation_pb2.PoolStatus:
        pool = self.manager.pool
        return pool.status() if pool is not None else generation_pb2.PoolStatus()
