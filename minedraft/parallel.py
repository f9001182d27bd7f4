"""One tensor-parallel group: the ranks that hold shards of the same model.

Built from its own `TCPStore` (rank 0 hosts it), never from the default process group, so
several groups (and the data plane's pair groups) can live in one process without
colliding. Two process groups share the store under different prefixes:

- "model": the model's collectives (all-reduce, all-gather) and tensor broadcasts, on the
  accelerator's backend (gloo on CPU, NCCL on CUDA);
- "control": small byte messages from the driver (rank 0) to the workers, always on gloo
  and the CPU, with a timeout of a year: an idle worker sits in `broadcast_bytes` until the
  next step arrives, however long that takes.

Ranks that share one GPU (NCCL refuses two ranks on a device) use gloo with the tensors
staged through host memory: correct, slow, meant for checks on one-GPU machines.

`TPGroup.single()` is the size-1 group: every collective is the identity, nothing is
connected, and the model is never sharded, so TP=1 costs nothing.
"""

from __future__ import annotations

import socket
from datetime import timedelta

import torch
import torch.distributed as dist

from minedraft.process_groups import check_backend, master_store, new_group

_CONTROL_TIMEOUT = timedelta(days=365)


class TPGroup:
    def __init__(self, rank: int, size: int, device: torch.device,
                 store: dist.Store | None = None, model_group: dist.ProcessGroup | None = None,
                 control_group: dist.ProcessGroup | None = None) -> None:
        """Use `create` or `single`; this only stores what they built."""
        _check_rank(rank, size)
        if size > 1 and (model_group is None or control_group is None):
            raise ValueError(f"a group of size {size} needs its model and control process groups")
        self.rank, self.size, self.device = rank, size, torch.device(device)
        self._store, self._model, self._control = store, model_group, control_group
        # gloo over device tensors: collectives run on host copies.
        self._staged = isinstance(model_group, dist.ProcessGroupGloo) and self.device.type != "cpu"

    @property
    def is_driver(self) -> bool:
        """Rank 0 decides what runs; the other ranks follow its control messages."""
        return self.rank == 0

    @classmethod
    def single(cls, device: torch.device | str = "cpu") -> TPGroup:
        return cls(0, 1, torch.device(device))

    @classmethod
    def create(cls, rank: int, size: int, host: str, port: int, backend: str = "gloo",
               device: torch.device | str = "cpu", timeout_s: float = 600.0,
               listener: socket.socket | None = None) -> TPGroup:
        """Join the group; blocks until all `size` ranks have joined (at most timeout_s).

        timeout_s also bounds each collective of the model group. Size 1 connects nothing.
        listener: rank 0's store socket, already listening on `port` (bound before the other
        ranks were given the port: see minedraft.service.network.listening_socket).
        """
        _check_rank(rank, size)
        device = torch.device(device)
        check_backend(backend, device, "tensor-parallel")
        if not isinstance(port, int) or not 1 <= port <= 65535:
            raise ValueError(f"port must be an int in 1..65535, got {port!r}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        if size == 1:
            return cls.single(device)
        timeout = timedelta(seconds=timeout_s)
        if listener is not None and (rank != 0 or listener.getsockname()[1] != port):
            raise ValueError(f"listener: rank 0's socket on port {port}, got rank {rank} and port "
                             f"{listener.getsockname()[1]}")
        store = (master_store(host, port, size, timeout, listener=listener) if rank == 0
                 else dist.TCPStore(host, port, world_size=size, is_master=False, timeout=timeout))
        model_group = new_group(dist.PrefixStore("model", store), rank, size, backend, device, timeout)
        control_group = dist.ProcessGroupGloo(dist.PrefixStore("control", store), rank, size,
                                              _CONTROL_TIMEOUT)
        return cls(rank, size, device, store, model_group, control_group)

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum over ranks, in place; -> tensor."""
        if self.size > 1:
            staged = tensor.cpu() if self._staged else tensor
            self._model.allreduce([staged]).wait()
            if staged is not tensor:
                tensor.copy_(staged)
        return tensor

    def all_gather_last(self, tensor: torch.Tensor) -> torch.Tensor:
        """[..., n] on each rank -> [..., size * n], rank r's piece at columns r * n .. (r + 1) * n."""
        if self.size == 1:
            return tensor
        device = tensor.device
        tensor = tensor.cpu().contiguous() if self._staged else tensor.contiguous()
        pieces = [torch.empty_like(tensor) for _ in range(self.size)]
        self._model.allgather([pieces], [tensor]).wait()
        return torch.cat(pieces, dim=-1).to(device)

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        """Overwrite `tensor` on every rank with rank src's, in place; -> tensor."""
        _check_rank(src, self.size, what="src")
        if self.size > 1:
            options = dist.BroadcastOptions()
            options.rootRank, options.rootTensor = src, 0
            staged = tensor.cpu() if self._staged else tensor
            self._model.broadcast([staged], options).wait()
            if staged is not tensor:
                tensor.copy_(staged)
        return tensor

    def broadcast_bytes(self, data: bytes | None) -> bytes:
        """The driver passes `data`, the other ranks pass None; every rank gets the bytes.

        Workers block here while the driver is idle (the control group never times out).
        """
        if self.is_driver and data is None:
            raise ValueError("the driver (rank 0) must pass the bytes to broadcast")
        if not self.is_driver and data is not None:
            raise ValueError(f"rank {self.rank} receives the broadcast bytes; pass None")
        if self.size == 1:
            return bytes(data)
        options = dist.BroadcastOptions()
        options.rootRank, options.rootTensor = 0, 0
        length = torch.tensor([len(data) if self.is_driver else 0], dtype=torch.int64)
        self._control.broadcast([length], options).wait()
        num_bytes = int(length.item())
        if num_bytes == 0:
            return b""
        if self.is_driver:
            payload = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        else:
            payload = torch.empty(num_bytes, dtype=torch.uint8)
        self._control.broadcast([payload], options).wait()
        return data if self.is_driver else payload.numpy().tobytes()

    def close(self) -> None:
        """Release both communicators; the store goes with this object. Idempotent."""
        for group in (self._model, self._control):
            if group is not None:
                group.shutdown()
        self._model = self._control = self._store = None

    def __repr__(self) -> str:
        return f"TPGroup(rank={self.rank}, size={self.size}, device={self.device})"


def _check_rank(rank: int, size: int, what: str = "rank") -> None:
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise ValueError(f"tensor-parallel size must be an int >= 1, got {size!r}")
    if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < size:
        raise ValueError(f"{what} must be an int in 0..{size - 1} for a group of size {size}, got {rank!r}")
