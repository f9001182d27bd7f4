"""Linear layers whose weights are packed once, ahead, for oneDNN's matmul (CPU, float32).

A verify step multiplies a few rows per request (k + 1 tokens) by every weight matrix. On
CPU, F.linear calls MKL's sgemm, which packs the weight matrix anew in every call of 4 rows
or more. Where the weights stream from memory (a model larger than the last-level cache)
that packing reads and writes them once more per call, so 4 rows cost about twice 3: the
memory-bound stand-in's 976 MB target (minedraft/bench/data/memory_bound) took 112 ms to
verify one request at k = 4 against 69 ms at k = 2, 180 ms for 4 requests at k = 2 against
107 ms for 4 plain tokens. Packed once at load, the weights are read once per call whatever
the rows: 93, 68, 112 and 86 ms (Intel Xeon, 2 threads; one forward each, medians of 2 to
4). So verifying k + 1 tokens costs nearly what one does, as on a GPU, which is what makes
speculation pay for such models.

Calls of fewer than PACKED_FROM rows keep MKL's own path, which reads the weights once
there and is the fastest (a packed call of 1 or 2 rows took 3-15% longer in the stand-in's
shapes, and 1.3-1.6x for the bundled target's small layers), so a packed layer holds its
weight twice. Models whose weights fit in the cache gain nothing measurable (the bundled
pair: 0.86-1.14 of unpacked per forward at 1 to 320 tokens, one or two threads, in noise)
and are left as they are (`packing_pays`).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

logger = logging.getLogger("minedraft.model")
PACKED_FROM = 4                 # rows (tokens) in a call from which the packed weight is used
UNKNOWN_CACHE_BYTES = 64 << 20  # taken as the last-level cache where the host does not say


class PackedLinear(nn.Linear):
    """nn.Linear with a oneDNN-packed copy of its weight (`packed`), used by calls of
    PACKED_FROM rows or more. Made by `pack_linears` from a loaded nn.Linear in place, so
    its parameters and hooks (tensor parallelism's all-reduce) stay as they were."""

    packed: torch.Tensor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() < PACKED_FROM * self.in_features:
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


def pack_linears(model: nn.Module) -> int:
    """Give every nn.Linear of a loaded model a packed weight. -> how many were packed."""
    count = 0
    with torch.no_grad():
        for module in model.modules():
            if type(module) is nn.Linear:
                module.packed = torch.ops.mkldnn._reorder_linear_weight(module.weight.detach())
                module.__class__ = PackedLinear     # (in place: the parameters and hooks stay)
                count += 1
    return count


def packing_available(device: torch.device, dtype: torch.dtype) -> bool:
    return (device.type == "cpu" and dtype == torch.float32 and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


def linear_weight_bytes(model: nn.Module) -> int:
    """The bytes of the model's linear weights, each counted once (a tied head is the embedding)."""
    seen = {id(m.weight): m.weight for m in model.modules() if isinstance(m, nn.Linear)}
    return sum(w.numel() * w.element_size() for w in seen.values())


def last_level_cache_bytes() -> int:
    """The largest CPU cache the host reports (Linux sysfs), else UNKNOWN_CACHE_BYTES."""
    sizes = []
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    for entry in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = entry.read_text().strip()
        try:
            sizes.append(int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text))
        except (ValueError, IndexError):
            continue
    return max(sizes, default=UNKNOWN_CACHE_BYTES)


def packing_pays(model: nn.Module, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether to pack: on CPU in float32, where the linear weights do not fit in the cache."""
    return packing_available(device, dtype) and linear_weight_bytes(model) > last_level_cache_bytes()
