"""How every service process runs: one log format (text for people, or JSON lines for
machines with --log-format json), uvloop, stop on SIGINT/SIGTERM, and, when a launcher
started it, an end with that launcher."""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from datetime import datetime, timezone

import uvloop

LOG_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"
LOG_FORMATS = ("text", "json")
# A LogRecord's own attributes; any other was passed with `extra=` and goes into the JSON.
_RECORD_FIELDS = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}
# Set by a launcher (minedraft.launcher.Cluster) to its pid in the environment of each service it starts.
LAUNCHER_PID_ENV = "MINEDRAFT_LAUNCHER_PID"
PR_SET_PDEATHSIG = 1


def end_with_launcher() -> None:
    """When a launcher started this process: have the kernel SIGTERM it (a graceful leave)
    when the launcher dies, however it dies (a SIGKILLed `minedraft bench` left its services
    running, each in its own session). Linux only; the signal comes when the launcher's
    thread that started this process ends, so clusters are started from a thread that
    outlives them. Called first thing in a service's main, once per process: the variable is
    taken out of the environment, so what this process starts in turn is not tied to the
    launcher (a TP verifier's followers would take the verifier's pid for a dead launcher's).
    The launcher cannot set it between fork and exec: a preexec_fn makes subprocess fork()
    rather than vfork(), and fork() in a process with gRPC's threads runs gRPC's fork
    handlers, which broke the launcher's own connections (HTTP/2 parse errors) and aborted
    children (gRPC check failures) before they ran the service."""
    launcher = os.environ.pop(LAUNCHER_PID_ENV, None)
    if launcher is None or sys.platform != "linux":
        return
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != int(launcher):               # the launcher died before that took hold
        os.kill(os.getpid(), signal.SIGTERM)


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message, the fields passed with `extra=`
    (the gateway's finished-request line carries its figures so), and the traceback if any."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {"time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(),
                 "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        entry.update((key, value) for key, value in vars(record).items() if key not in _RECORD_FIELDS)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def add_log_format_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log-format", default="text", choices=LOG_FORMATS,
                        help="text: one readable line a record; json: one JSON object a line, for log collectors")


def configure_logging(log_level: str, log_format: str = "text") -> None:
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {LOG_FORMATS}, got {log_format!r}")
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(LOG_FORMAT))
    logging.basicConfig(level=log_level.upper(), handlers=[handler])


def run(main: Callable[[], Awaitable[None]], log_level: str = "INFO", log_format: str = "text") -> None:
    """Run a service's main coroutine on uvloop until SIGINT/SIGTERM."""
    configure_logging(log_level, log_format)

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

    try:
        uvloop.run(guarded())
    except MemoryError as err:
        # Said in one line rather than a traceback: the fix is a flag (say --num-blocks).
        logging.getLogger("minedraft.service").critical("out of memory: %s", err)
        raise SystemExit(1) from None
