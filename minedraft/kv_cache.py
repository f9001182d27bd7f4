"""Paged KV cache: fixed-size blocks, a block table per request, allocation on demand.

`BlockManager` is the bookkeeping (block lists and lengths; it only builds the slot index
tensor a forward pass needs), so it can be tested and reasoned about alone; `KVCache`
holds the cached keys and values. A request's length is the number of positions whose
KV is cached; rollback of rejected drafts is a truncation of that length (the stale KV
stays in place and is overwritten later), freeing whole blocks that fall off the end.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

GiB = 1024 ** 3


class OutOfBlocks(RuntimeError):
    """Not enough free blocks for the requested allocation; nothing was allocated."""

    def __init__(self, needed: int, free: int) -> None:
        super().__init__(f"KV cache out of blocks: needed {needed}, free {free}")
        self.needed, self.free = needed, free


@dataclass
class _Allocation:
    blocks: list[int] = field(default_factory=list)
    length: int = 0


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks, self.block_size = num_blocks, block_size
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self._requests: dict[str, _Allocation] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._requests

    def length(self, request_id: str) -> int:
        alloc = self._requests.get(request_id)
        return 0 if alloc is None else alloc.length

    def blocks_needed(self, request_id: str, new_length: int) -> int:
        have = len(self._requests[request_id].blocks) if request_id in self._requests else 0
        return max(0, -(-new_length // self.block_size) - have)

    def grow(self, lengths: dict[str, int]) -> None:
        """Extend each request to its new length, all or nothing."""
        needed = sum(self.blocks_needed(rid, n) for rid, n in lengths.items())
        if needed > len(self._free):
            raise OutOfBlocks(needed, len(self._free))
        for rid, new_length in lengths.items():
            alloc = self._requests.setdefault(rid, _Allocation())
            for _ in range(self.blocks_needed(rid, new_length)):
                alloc.blocks.append(self._free.pop())
            alloc.length = max(alloc.length, new_length)

    def truncate(self, request_id: str, new_length: int) -> None:
        """Drop positions >= new_length (rejected drafts); frees blocks no longer used."""
        alloc = self._requests[request_id]
        if new_length > alloc.length:
            raise ValueError(f"cannot truncate {request_id!r} from {alloc.length} up to {new_length}")
        keep = -(-new_length // self.block_size)
        while len(alloc.blocks) > keep:
            self._free.append(alloc.blocks.pop())
        alloc.length = new_length

    def free(self, request_id: str) -> None:
        alloc = self._requests.pop(request_id, None)
        if alloc is not None:
            self._free.extend(reversed(alloc.blocks))

    def slots(self, request_id: str, length: int) -> torch.Tensor:
        """Cache slot of every position 0 .. length - 1, as an int64 tensor [length]."""
        blocks = torch.tensor(self._requests[request_id].blocks, dtype=torch.int64)
        offsets = torch.arange(self.block_size, dtype=torch.int64)
        return (blocks.unsqueeze(1) * self.block_size + offsets).flatten()[:length]


class KVCache:
    """Per layer one key and one value tensor [num_blocks * block_size, kv_heads, head_dim]."""

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device | str) -> None:
        shape = (num_layers, 2, num_blocks * block_size, num_kv_heads, head_dim)
        needed = math.prod(shape) * dtype.itemsize
        available = available_memory(torch.device(device))
        if available is not None and needed > available:
            # Allocated anyway, the cache would be filled as it is zeroed, and the kernel's
            # OOM killer would end this process or another on the host (a bench that started
            # four memory-bound clusters at once lost an idle one's verifier so).
            raise MemoryError(f"the KV cache of --num-blocks {num_blocks} (--block-size {block_size}) needs "
                              f"{needed / GiB:.2f} GiB on {device}, and {available / GiB:.2f} GiB is available: "
                              f"lower --num-blocks")
        self.storage = torch.zeros(shape, dtype=dtype, device=device)
        self.layers = [(self.storage[i, 0], self.storage[i, 1]) for i in range(num_layers)]

    @property
    def nbytes(self) -> int:
        return self.storage.numel() * self.storage.element_size()


def available_memory(device: torch.device) -> int | None:
    """Bytes free for a new allocation on `device` (MemAvailable on the host for the CPU), or
    None where that cannot be read."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
