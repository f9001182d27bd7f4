"""Private torch.distributed process groups, built directly on a store: no default group,
so tensor-parallel groups and data-plane pairs live side by side in one process."""

from __future__ import annotations

import socket
from datetime import timedelta

import torch
import torch.distributed as dist

from minedraft.constants import DISTRIBUTED_BACKENDS
from minedraft.service.network import listening_socket


def master_store(host: str, port: int, world_size: int, timeout: timedelta,
                 wait_for_workers: bool = True, listener: socket.socket | None = None) -> dist.TCPStore:
    """A rendezvous store listening on `host` only (port 0: any free port, `store.port`), or
    on `listener`, a socket already listening (listening_socket) whose port the workers were
    given. TCPStore alone listens on every interface whatever host it is given, so the socket
    is bound here and handed over: a store for 127.0.0.1 is not reachable from the network."""
    sock = listener if listener is not None else listening_socket(host, port)
    bound = sock.getsockname()[1]
    return dist.TCPStore(host, bound, world_size=world_size, is_master=True, timeout=timeout,
                         wait_for_workers=wait_for_workers, master_listen_fd=sock.detach())


def check_backend(backend: str, device: torch.device, what: str) -> None:
    """Refuse a backend the device cannot use (`what` names the caller's flag in the error)."""
    if backend not in DISTRIBUTED_BACKENDS:
        raise ValueError(f"{what} backend must be one of {DISTRIBUTED_BACKENDS}, got {backend!r}")
    if backend == "nccl" and device.type != "cuda":
        raise ValueError(f"backend 'nccl' needs a cuda device, got {device}")


def new_group(store: dist.Store, rank: int, size: int, backend: str, device: torch.device,
              timeout: timedelta) -> dist.ProcessGroup:
    """gloo, or NCCL bound to `device`; `timeout` bounds every collective of the group."""
    if backend == "gloo":
        return dist.ProcessGroupGloo(store, rank, size, timeout)
    if not hasattr(dist, "ProcessGroupNCCL"):
        raise RuntimeError("backend 'nccl' requested but this torch build has no NCCL")
    torch.cuda.set_device(device)       # NCCL binds its communicator to the current device
    options = dist.ProcessGroupNCCL.Options()
    options._timeout = timeout
    return dist.ProcessGroupNCCL(store, rank, size, options)
