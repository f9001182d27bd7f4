"""The drafter pool: any number of drafters, joining and leaving at run time.

Each request lives on one drafter (its draft KV is there). New requests go to the
least-loaded drafter that can hold them; a drafter that leaves or dies hands its requests
back to the Batch Manager, which re-homes them (re-prefilled from their verified tokens) or,
with no drafter left, keeps them going at k = 0 on the verifier.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field

import grpc

from minedraft.service.auth import proves_membership
from minedraft.service.security import DialSecurity
from minedraft.service.server import wait_healthy
from minedraft.v1 import engine_pb2, engine_pb2_grpc, generation_pb2

logger = logging.getLogger("minedraft.gateway")


@dataclass(eq=False)
class DrafterHandle:
    address: str
    drafter_id: str
    model: str
    num_blocks: int
    channel: grpc.aio.Channel
    stub: engine_pb2_grpc.DrafterStub
    # Written by the admission ledger (gateway/admission.py) only; the pool reports them.
    reserved_blocks: int = 0
    requests_assigned: int = 0
    request_ids: set[str] = field(default_factory=set)
    pending_frees: list[str] = field(default_factory=list)   # finished requests to free there
    in_flight: Counter[str] = field(default_factory=Counter)  # request ids named by calls not yet answered
    compute_s: float = 0.0          # its own compute seconds in draft calls (a metric; the profile's not counted)

    def status(self) -> generation_pb2.DrafterStatus:
        return generation_pb2.DrafterStatus(address=self.address, drafter_id=self.drafter_id,
                                            num_requests=len(self.request_ids),
                                            reserved_blocks=self.reserved_blocks, num_blocks=self.num_blocks,
                                            requests_assigned=self.requests_assigned)


class PoolError(ValueError):
    """A drafter cannot join: its address is malformed or its model does not fit the target."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class DrafterUnreachable(PoolError):
    """Nothing at the address answers as a drafter of this deployment. One error for every
    such case (closed port, another service, a drafter that cannot prove itself), so the
    answer tells a caller nothing about what else lives at an address."""

    code = grpc.StatusCode.UNAVAILABLE

    def __init__(self, address: str) -> None:
        super().__init__(f"address: {address} is not a reachable drafter of this deployment")


class DrafterPool:
    def __init__(self, target: engine_pb2.EngineInfo, dial: DialSecurity | None = None,
                 connect_timeout_s: float = 30.0) -> None:
        self.target = target
        self.dial = dial or DialSecurity()
        self.connect_timeout_s = connect_timeout_s
        self.drafters: dict[str, DrafterHandle] = {}       # by address

    def __len__(self) -> int:
        return len(self.drafters)

    async def add(self, address: str, timeout_s: float | None = None) -> DrafterHandle:
        """timeout_s: how long to wait for the drafter to answer (default: the pool's)."""
        timeout_s = self.connect_timeout_s if timeout_s is None else timeout_s
        if not address or ":" not in address:
            raise PoolError(f"address: expected HOST:PORT, got {address!r}")
        if address in self.drafters:
            return self.drafters[address]
        try:
            await wait_healthy(address, timeout_s, self.dial)
        except TimeoutError as err:
            logger.info("drafter %s did not become healthy: %s", address, err)
            raise DrafterUnreachable(address) from None
        channel = self.dial.aio_channel(address)
        stub = engine_pb2_grpc.DrafterStub(channel)
        try:
            # With an internal token, the drafter proves it knows it before it is sent it.
            if self.dial.token and not await proves_membership(channel, self.dial.token, timeout_s):
                raise DrafterUnreachable(address)
            info = await stub.GetInfo(engine_pb2.EngineInfoRequest(), timeout=timeout_s)
            if not info.drafter_id:
                raise DrafterUnreachable(address)
        except (grpc.aio.AioRpcError, DrafterUnreachable) as err:
            await channel.close()
            logger.info("%s did not answer as a drafter: %s", address, err)
            raise DrafterUnreachable(address) from None
        problem = None
        if info.vocab_size != self.target.vocab_size:
            problem = f"draft vocab {info.vocab_size} != target vocab {self.target.vocab_size}"
        elif info.dtype != self.target.dtype:
            problem = f"draft dtype {info.dtype} != target dtype {self.target.dtype}"
        elif info.block_size != self.target.block_size:     # admission counts both in one block size
            problem = f"draft block size {info.block_size} != target block size {self.target.block_size}"
        if problem:
            await channel.close()
            raise PoolError(f"address: drafter {address}: {problem}")
        # It forgets every request before it is given any: one that rejoins after being dropped
        # (a missed deadline) may still hold requests since moved elsewhere. Answered before any
        # other call goes out: a reset that overtook a call giving it a request would wipe that.
        try:
            await stub.Step(engine_pb2.DraftStepRequest(reset=True), timeout=timeout_s)
        except grpc.aio.AioRpcError as err:
            await channel.close()
            logger.info("%s did not take a reset: %s", address, err)
            raise DrafterUnreachable(address) from None
        handle = DrafterHandle(address, info.drafter_id, info.model, info.num_blocks, channel, stub)
        self.drafters[address] = handle
        logger.info("drafter %s (%s) joined the pool (%d drafters)", address, info.drafter_id[:8], len(self))
        return handle

    def remove(self, address: str) -> DrafterHandle | None:
        """Take a drafter out of the pool; the caller re-homes its requests."""
        handle = self.drafters.pop(address, None)
        if handle is not None:
            logger.info("drafter %s left the pool (%d drafters)", address, len(self))
        return handle

    def status(self) -> generation_pb2.PoolStatus:
        return generation_pb2.PoolStatus(drafters=[h.status() for h in self.drafters.values()])
