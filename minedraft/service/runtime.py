"""How every service process runs: one log format, uvloop, stop on SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable

import uvloop

LOG_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"


def configure_logging(log_level: str) -> None:
    logging.basicConfig(level=log_level.upper(), format=LOG_FORMAT)


def run(main: Callable[[], Awaitable[None]], log_level: str = "INFO") -> None:
    """Run a service's main coroutine on uvloop until SIGINT/SIGTERM."""
    configure_logging(log_level)

    async def guarded() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        task = asyncio.ensure_future(main())
        waiter = asyncio.ensure_future(stop.wait())
        done, _ = await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            task.result()
        else:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass

    uvloop.run(guarded())
