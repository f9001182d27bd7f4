"""What keeps the gateway honest about being able to serve: it watches the verifier and the
Batch Manager's own task, and its health says SERVING only while both are well.

- The verifier is probed every `interval_s`. After `misses` probes in a row without a
  SERVING answer (3, each allowed 2 s) it counts as down: health turns NOT_SERVING, every
  request in flight ends with UNAVAILABLE (its state on the verifier is gone or unreachable)
  and new requests are refused with UNAVAILABLE. Once it answers again, health returns to SERVING by itself.
  A verifier that restarted between two probes is recognised by its new instance id and
  treated the same way. Drafters leave the pool until they have paired with the new
  verifier (on their own) and rejoined it.
- The Batch Manager's task must never end. If it does, that is a bug: it is logged with
  its traceback, health turns NOT_SERVING and the gateway exits non-zero so that a
  supervisor restarts it.
"""

from __future__ import annotations

import asyncio
import logging

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gateway.batch_manager import BatchManager
from minedraft.service.server import Served
from minedraft.v1 import engine_pb2, engine_pb2_grpc

logger = logging.getLogger("minedraft.gateway")


class VerifierWatch:
    def __init__(self, manager: BatchManager, channel: grpc.aio.Channel, served: Served, instance_id: str,
                 interval_s: float = 1.0, misses: int = 3, probe_timeout_s: float = 2.0) -> None:
        self.manager, self.served = manager, served
        self.health = health_pb2_grpc.HealthStub(channel)
        self.verifier = engine_pb2_grpc.VerifierStub(channel)
        self.instance_id = instance_id
        # A busy host may answer a probe late now and then: only `misses` in a row count.
        self.interval_s, self.misses, self.probe_timeout_s = interval_s, misses, probe_timeout_s
        self.up = True

    async def run(self) -> None:
        missed = 0
        while True:
            await asyncio.sleep(self.interval_s)
            instance = await self._probe()
            if instance is None:
                missed += 1
                if missed >= self.misses and self.up:
                    await self._down("the verifier is unreachable")
                continue
            missed = 0
            if instance != self.instance_id:
                if self.up:
                    await self._down("the verifier restarted")
                self.instance_id = instance
                self._drop_drafters()
            if not self.up:
                await self._back()

    async def _probe(self) -> str | None:
        """The verifier's instance id if it is SERVING, else None."""
        timeout = self.probe_timeout_s
        try:
            reply = await self.health.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout)
            if reply.status != health_pb2.HealthCheckResponse.SERVING:
                return None
            info = await self.verifier.GetInfo(engine_pb2.EngineInfoRequest(), timeout=timeout)
            return info.instance_id
        except grpc.aio.AioRpcError:
            return None

    async def _down(self, why: str) -> None:
        self.up = False
        logger.error("%s: health NOT_SERVING; requests in flight fail with UNAVAILABLE", why)
        self.manager.unavailable = f"{why}; retry later"
        await self.served.set_serving(False)
        self.manager.fail_all(grpc.StatusCode.UNAVAILABLE, f"{why}; the request was lost with it, retry it")
        self.manager.calls.free_on_verifier.clear()     # the requests went with the old verifier

    def _drop_drafters(self) -> None:
        """Drafters paired with the old verifier are not drafters of the new one until they
        pair again, which they do by themselves and then rejoin the pool; meanwhile their
        requests run at k = 0."""
        pool = self.manager.pool
        for address in list(pool.drafters) if pool is not None else []:
            self.manager.remove_drafter(address, graceful=False)

    async def _back(self) -> None:
        self.up = True
        self.manager.unavailable = None
        await self.served.set_serving(True)
        logger.warning("the verifier is back (instance %s): serving again", self.instance_id[:8])


async def supervise(manager: BatchManager, served: Served, watch: VerifierWatch,
                    drain_timeout_s: float = 30.0) -> None:
    """Run the Batch Manager and the verifier watch until the server stops; either ending
    on its own is fatal (logged, NOT_SERVING, SystemExit(1)). Cancelled (SIGTERM): stop
    admitting, let the Batch Manager finish what is in flight, then stop."""
    tasks = {asyncio.ensure_future(manager.run()): "the Batch Manager",
             asyncio.ensure_future(watch.run()): "the verifier watch",
             asyncio.ensure_future(served.server.wait_for_termination()): "the server"}
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        logger.info("stopping: no new requests; draining those in flight (at most %.0f s)", drain_timeout_s)
        await served.set_serving(False)
        await drain(manager, drain_timeout_s)
        raise
    finally:
        for task in tasks:
            task.cancel()
    for task in done:
        if tasks[task] == "the server":
            return
        await served.set_serving(False)
        error = task.exception()
        logger.critical("%s stopped (%s): exiting so that a supervisor restarts the gateway",
                        tasks[task], "no error" if error is None else repr(error), exc_info=error)
        raise SystemExit(1)


async def drain(manager: BatchManager, timeout_s: float) -> None:
    """Stop admitting; let the requests in flight finish for up to timeout_s, fail the rest,
    and hand every finished request's KV back to the services."""
    manager.unavailable = "the server is shutting down"
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while manager.requests and loop.time() < deadline:
        await asyncio.sleep(0.05)
    if manager.requests:
        logger.warning("drain: %d requests did not finish within %.0f s", len(manager.requests), timeout_s)
        manager.fail_all(grpc.StatusCode.UNAVAILABLE, "the server is shutting down")
    while manager.steps_in_flight and loop.time() < deadline + 5.0:
        await asyncio.sleep(0.05)           # a failed request's step may still be in flight
    await manager.flush_frees()
