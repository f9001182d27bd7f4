"""Private torch.distributed process groups, built directly on a store: no default group,
so tensor-parallel groups and data-plane pairs live side by side in one process."""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from minedraft.constants import DISTRIBUTED_BACKENDS


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
