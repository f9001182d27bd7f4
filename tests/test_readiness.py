"""Waiting for a peer without fixed sleeps: wait_healthy follows the health Watch stream and
the channel's readiness; a drafter's registration waits for its gateway and retries with
backoff, but gives up at once on a refusal that asking again cannot change."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from drafter_svc.membership import PoolAdmin, PoolRefused
from minedraft.service.backoff import Backoff
from minedraft.service.network import free_port
from minedraft.service.security import DialSecurity
from minedraft.service.server import start_server, wait_healthy
from minedraft.v1 import generation_pb2, generation_pb2_grpc

FAST = Backoff(initial_s=0.01, max_s=0.05)


def test_backoff_grows_to_its_ceiling_with_jitter():
    delays = [next(d) for d in [Backoff(initial_s=0.1, max_s=1.0, jitter=0.25).delays()] for _ in range(8)]
    assert 0.1 <= delays[0] <= 0.125 and 0.2 <= delays[1] <= 0.25
    assert all(1.0 <= delay <= 1.25 for delay in delays[4:])
    with pytest.raises(ValueError, match="backoff"):
        Backoff(initial_s=2.0, max_s=1.0)


def test_wait_healthy_returns_when_a_late_server_starts_and_turns_serving():
    """The server binds 0.4 s after the wait began and reports NOT_SERVING for 0.3 s more: the
    wait ends on the change to SERVING, not on some poll after it."""
    port = free_port()

    async def scenario() -> tuple[float, float]:
        async def late_server():
            await asyncio.sleep(0.4)
            served = await start_server(lambda s: None, "127.0.0.1", port, ["test.Service"])
            await served.set_serving(False)
            await asyncio.sleep(0.3)
            await served.set_serving(True)
            return served, time.monotonic()

        server_task = asyncio.ensure_future(late_server())
        await wait_healthy(f"127.0.0.1:{port}", timeout_s=10)
        returned = time.monotonic()
        served, serving_at = await server_task
        await served.server.stop(None)
        return returned, serving_at

    returned, serving_at = asyncio.run(scenario())
    assert 0 <= returned - serving_at < 0.5


def test_wait_healthy_times_out_without_a_server():
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="not healthy after 1 s"):
        asyncio.run(wait_healthy(f"127.0.0.1:{free_port()}", timeout_s=1.0))
    assert time.monotonic() - start < 3.0


class FlakyPool(generation_pb2_grpc.DrafterPoolServicer):
    """Answers Register with `failures` codes first, then takes the drafter."""

    def __init__(self, failures: list[grpc.StatusCode]) -> None:
        self.failures = list(failures)
        self.calls = 0

    async def Register(self, request, context):
        self.calls += 1
        if self.failures:
            await context.abort(self.failures.pop(0), "not now")
        return generation_pb2.PoolStatus()


async def _serve_pool(pool: FlakyPool, port: int = 0):
    return await start_server(lambda s: generation_pb2_grpc.add_DrafterPoolServicer_to_server(pool, s),
                              "127.0.0.1", port, ["minedraft.v1.DrafterPool"])


def test_registration_retries_until_the_pool_takes_the_drafter():
    pool = FlakyPool([grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE])

    async def scenario() -> None:
        served = await _serve_pool(pool)
        admin = PoolAdmin(f"127.0.0.1:{served.port}", DialSecurity(), backoff=FAST)
        await asyncio.wait_for(admin.register("127.0.0.1:1234"), 10)
        await admin.close()
        await served.server.stop(None)

    asyncio.run(scenario())
    assert pool.calls == 4


def test_registration_waits_for_a_gateway_that_is_not_up_yet():
    port = free_port()
    pool = FlakyPool([])

    async def scenario() -> None:
        admin = PoolAdmin(f"127.0.0.1:{port}", DialSecurity(), backoff=FAST)
        joining = asyncio.ensure_future(admin.register("127.0.0.1:1234"))
        await asyncio.sleep(0.5)
        assert not joining.done()
        served = await _serve_pool(pool, port)
        await asyncio.wait_for(joining, 10)
        await admin.close()
        await served.server.stop(None)

    asyncio.run(scenario())
    assert pool.calls == 1


@pytest.mark.parametrize("code", [grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT,
                                  grpc.StatusCode.UNAUTHENTICATED])
def test_registration_gives_up_on_a_refusal(code):
    pool = FlakyPool([code] * 5)

    async def scenario() -> None:
        served = await _serve_pool(pool)
        admin = PoolAdmin(f"127.0.0.1:{served.port}", DialSecurity(), backoff=FAST)
        try:
            with pytest.raises(PoolRefused, match=f"refused 127.0.0.1:1234: {code.name}: not now"):
                await asyncio.wait_for(admin.register("127.0.0.1:1234"), 10)
        finally:
            await admin.close()
            await served.server.stop(None)

    asyncio.run(scenario())
    assert pool.calls == 1
