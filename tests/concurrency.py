"""Run test work side by side and collect what each part returned: calls on threads (requests
to a served cluster), or functions in spawned processes (ranks, pairs of peers)."""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


def run_concurrently(calls: list[Callable[[], T]], workers: int | None = None,
                     while_running: Callable[[], None] | None = None) -> list[T]:
    """-> each call's result, in the order of `calls`; the first exception raised is re-raised.

    `workers` bounds how many run at once (default: all). `while_running` runs on this thread
    once every call has been submitted, for what must happen mid-run (killing a service).
    """
    with ThreadPoolExecutor(workers or max(len(calls), 1)) as pool:
        futures = [pool.submit(call) for call in calls]
        if while_running is not None:
            while_running()
        return [future.result() for future in futures]


def run_in_processes(jobs: list[tuple[Callable[..., None], tuple]], timeout_s: float) -> list[tuple]:
    """Start `target(*args, reports)` for each (target, args) in a spawned process; -> the one
    report tuple each puts on the `reports` queue, in arrival order. Every process is joined,
    or killed, before this returns, whether or not the reports arrived in time."""
    ctx = mp.get_context("spawn")
    reports = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, reports), daemon=True) for target, args in jobs]
    for proc in procs:
        proc.start()
    received: list[tuple[Any, ...]] = []
    try:
        for _ in procs:
            received.append(reports.get(timeout=timeout_s))
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join()
    return received
