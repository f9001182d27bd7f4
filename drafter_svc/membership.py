"""A drafter's two memberships, kept alive: its data-plane pairing with the verifier and its
place in the gateway's drafter pool.

- Pairing: ConnectDrafter gives a rendezvous address (or in-band) and a pairing key; the
  drafter joins and sends drafts there. When the verifier restarts (a new instance id) or a
  send fails (the verifier dropped the pairing after drafts came too late), the drafter
  pairs again, with its key. Its requests stay: the gateway frees those it gave up on.
- Pool: with --register-with the drafter registers at the gateway's admin API, waiting for
  the gateway to come up and retrying with backoff while it cannot take the drafter yet (but
  not a refusal that retrying cannot change: a wrong token, an ar-mode gateway, a draft model
  that does not fit the target), and checks every few seconds that it is still listed: a
  gateway that dropped it (a missed deadline, a SIGSTOP) or restarted gets it back without
  anyone's help, paired anew first. On stop it deregisters and leaves its pairing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import grpc

from drafter_svc.servicer import DrafterServicer
from minedraft.data_plane import DraftSender
from minedraft.service.backoff import RECONNECT_OPTIONS, Backoff
from minedraft.service.security import DialSecurity
from minedraft.v1 import engine_pb2, engine_pb2_grpc, generation_pb2, generation_pb2_grpc

logger = logging.getLogger("minedraft.drafter")
CALL_TIMEOUT_S = 10.0
CHECK_INTERVAL_S = 2.0
REGISTER_BACKOFF = Backoff(initial_s=0.2, max_s=10.0)
# What the pool answers when asking again cannot help; anything else (UNAVAILABLE: the gateway
# is away or cannot reach this drafter yet; DEADLINE_EXCEEDED; ...) is retried.
REFUSALS = frozenset({grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION,
                      grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED,
                      grpc.StatusCode.UNIMPLEMENTED})


class PoolRefused(RuntimeError):
    """The gateway's pool will not take this drafter however often it asks."""


class Pairing:
    """The drafter's end of its data-plane pairing with one verifier instance."""

    def __init__(self, verifier: engine_pb2_grpc.VerifierStub, drafter_id: str,
                 open_sender) -> None:
        """open_sender(ConnectDrafterResponse) -> DraftSender (blocking; run off the loop)."""
        self.verifier, self.drafter_id, self._open_sender = verifier, drafter_id, open_sender
        self.key = ""
        self.instance_id = ""
        self.data_plane = ""
        self._renewing = asyncio.Lock()     # the keep-alive and a rejoin may both pair again

    async def connect(self) -> DraftSender:
        info = await self.verifier.GetInfo(engine_pb2.EngineInfoRequest(), timeout=CALL_TIMEOUT_S)
        if info.instance_id != self.instance_id:
            self.key = ""                   # a new verifier knows no key
        reply = await self.verifier.ConnectDrafter(
            engine_pb2.ConnectDrafterRequest(drafter_id=self.drafter_id, pairing_key=self.key),
            timeout=CALL_TIMEOUT_S)
        self.key, self.instance_id, self.data_plane = reply.pairing_key, info.instance_id, reply.data_plane
        return await asyncio.get_running_loop().run_in_executor(None, self._open_sender, reply)

    async def renew(self, servicer: DrafterServicer) -> None:
        """Pair again; sends from now on go to the new pairing."""
        async with self._renewing:
            servicer.replace_sender(await self.connect())

    async def renew_before_rejoining(self, servicer: DrafterServicer) -> bool:
        """A drafter the pool dropped (a missed deadline) was most likely dropped by the
        verifier too, after its drafts came late, and learns so only when a send fails: by
        then it would be drafting again for nothing. So it pairs anew before it rejoins.
        -> whether it is paired with the verifier serving now."""
        try:
            await self.renew(servicer)
        except (grpc.aio.AioRpcError, OSError, RuntimeError, TimeoutError) as err:
            logger.warning("pairing again before rejoining the pool failed (%s), will retry", err)
            return False
        return True

    async def verifier_instance(self) -> str | None:
        try:
            info = await self.verifier.GetInfo(engine_pb2.EngineInfoRequest(), timeout=CALL_TIMEOUT_S)
            return info.instance_id
        except grpc.aio.AioRpcError:
            return None

    async def disconnect(self) -> None:
        try:
            await self.verifier.DisconnectDrafter(
                engine_pb2.DisconnectDrafterRequest(drafter_id=self.drafter_id, pairing_key=self.key),
                timeout=5.0)
        except grpc.aio.AioRpcError:
            pass


async def keep_paired(pairing: Pairing, servicer: DrafterServicer) -> None:
    """Pair again whenever the verifier restarted or a send failed."""
    while True:
        await asyncio.sleep(CHECK_INTERVAL_S / 2)
        instance = await pairing.verifier_instance()
        if instance is None or (instance == pairing.instance_id and not servicer.send_failed):
            continue
        why = "the verifier restarted" if instance != pairing.instance_id else "a send failed"
        try:
            await pairing.renew(servicer)
        except (grpc.aio.AioRpcError, OSError, RuntimeError, TimeoutError) as err:
            logger.warning("%s; pairing again failed (%s), will retry", why, err)
            continue
        logger.warning("%s: paired again with verifier %s", why, pairing.instance_id[:8])


class PoolAdmin:
    """This drafter's membership of one gateway's pool, through its admin API."""

    def __init__(self, admin: str, dial: DialSecurity, backoff: Backoff = REGISTER_BACKOFF) -> None:
        self.admin = admin
        self.channel = dial.aio_channel(admin, options=RECONNECT_OPTIONS)
        self.stub = generation_pb2_grpc.DrafterPoolStub(self.channel)
        self.backoff = backoff

    async def register(self, address: str) -> None:
        """Join the pool. Each attempt waits for the gateway to be reachable (wait_for_ready),
        so one that is still starting is joined as soon as it serves; a failed attempt is
        retried after a backoff, a refusal (REFUSALS) raises PoolRefused."""
        for delay in self.backoff.delays():
            try:
                await self.stub.Register(generation_pb2.DrafterEndpoint(address=address), timeout=CALL_TIMEOUT_S,
                                         wait_for_ready=True)
                logger.info("joined the drafter pool at %s", self.admin)
                return
            except grpc.aio.AioRpcError as err:
                if err.code() in REFUSALS:
                    raise PoolRefused(f"the drafter pool at {self.admin} refused {address}: "
                                      f"{err.code().name}: {err.details()}") from None
                logger.warning("could not join the drafter pool at %s (%s: %s); retrying in %.1f s",
                               self.admin, err.code().name, err.details(), delay)
            await asyncio.sleep(delay)

    async def keep_registered(self, address: str, pair_again: Callable[[], Awaitable[bool]],
                              dismissed: Callable[[], bool]) -> None:
        """Rejoin whenever the pool no longer lists this drafter, once `pair_again()` has
        paired it anew with the verifier that serves now (the gateway drops drafters of a
        verifier that restarted, and the verifier those whose drafts came late), and never
        once the pool dismissed it (an operator deregistered it)."""
        while True:
            await asyncio.sleep(CHECK_INTERVAL_S)
            try:
                status = await self.stub.List(generation_pb2.ListDraftersRequest(), timeout=CALL_TIMEOUT_S)
            except grpc.aio.AioRpcError:
                continue                    # the gateway is away: ask again later
            if dismissed():
                continue                    # still serving, for whatever calls it yet
            if not any(d.address == address for d in status.drafters) and await pair_again():
                logger.warning("no longer in the drafter pool at %s: joining again", self.admin)
                await self.register(address)

    async def leave(self, address: str) -> None:
        try:
            await self.stub.Deregister(generation_pb2.DrafterEndpoint(address=address), timeout=5.0)
        except grpc.aio.AioRpcError as err:
            logger.warning("could not leave the drafter pool: %s", err.details())

    async def close(self) -> None:
        await self.channel.close()
