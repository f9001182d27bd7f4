"""Where a service computes: which GPU among replicas on one host, which CPU cores, which thread."""

from __future__ import annotations

import os
import socket
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import IO


def resolve_device(device: str, lock_dir: str) -> tuple[str, IO | None]:
    """'cuda:auto': the first visible GPU whose lock this process can hold (replicas on one
    host spread over their GPUs); when every GPU is taken, they share round-robin.
    -> (device, the lock's file, which the caller keeps open as long as it uses the GPU)."""
    if device != "cuda:auto":
        return device, None
    import fcntl

    import torch

    count = torch.cuda.device_count()
    if count == 0:
        raise SystemExit("--device cuda:auto: no CUDA device is visible")
    os.makedirs(lock_dir, exist_ok=True)
    for index in range(count):
        handle = open(os.path.join(lock_dir, f"gpu{index}.lock"), "w")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            continue
        return f"cuda:{index}", handle
    # More replicas than GPUs: spread by host name (replicas in containers share a pid).
    return f"cuda:{zlib.crc32(f'{socket.gethostname()}:{os.getpid()}'.encode()) % count}", None


def parse_cpus(spec: str) -> set[int]:
    """'0,2-3' -> {0, 2, 3}."""
    cpus: set[int] = set()
    for part in filter(None, spec.split(",")):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def place_process(cpus: str) -> None:
    """Every thread of the process, not only the caller: the verifier places itself from a
    worker thread, and its event loop's thread starts the compute thread."""
    if cpus and hasattr(os, "sched_setaffinity"):
        pin_all_threads(parse_cpus(cpus))


def pin_all_threads(cpus: set[int] | frozenset[int]) -> None:
    """sched_setaffinity(0, ...) moves only the calling thread. Every thread of the process
    moves here; one started during a pass may carry its creator's old mask, so passes repeat
    until no new thread appears."""
    done: set[int] = set()
    while True:
        tids = {int(tid) for tid in os.listdir("/proc/self/task")} - done
        if not tids:
            return
        for tid in tids:
            try:
                os.sched_setaffinity(tid, cpus)
            except ProcessLookupError:      # it ended meanwhile
                pass
        done |= tids


def compute_thread(name: str) -> ThreadPoolExecutor:
    """The one thread that runs all of a service's model work, loading the model included.

    torch's CPU kernels run on OpenMP (libgomp), and a thread that once ran a parallel region
    keeps its team of workers for life. While the process holds more such workers than it has
    cores, every team stops spinning between regions and sleeps on a futex instead, so each of
    the hundreds of regions in a forward waits on a wake-up. A verifier that loaded its model
    with two threads on the start-up thread and decoded on another took 16-17 ms a step of 16
    requests on two cores, more than on one (15 ms); loading on the compute thread, 11-12 ms.
    """
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
