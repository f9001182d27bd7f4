"""The tensor-parallel group itself: a group of one whose collectives are identities, and the
arguments TPGroup.create refuses before it dials anyone."""

from __future__ import annotations

import pytest
import torch

from minedraft.parallel import TPGroup


def test_single_group_collectives_are_identities() -> None:
    tp = TPGroup.single()
    assert (tp.rank, tp.size, tp.is_driver, tp.device) == (0, 1, True, torch.device("cpu"))
    t = torch.randn(3, 5)
    assert tp.all_reduce(t) is t and tp.all_gather_last(t) is t and tp.broadcast(t) is t
    assert tp.broadcast_bytes(b"step") == b"step"
    with pytest.raises(ValueError, match="driver"):
        tp.broadcast_bytes(None)
    tp.close()


@pytest.mark.parametrize("kwargs, match", [
    (dict(rank=2, size=2), "rank must be an int in 0..1"),
    (dict(rank=0, size=0), "size must be an int >= 1"),
    (dict(rank=0, size=2, backend="mpi"), "backend must be one of"),
    (dict(rank=0, size=2, backend="nccl"), "needs a cuda device"),
    (dict(rank=0, size=2, port=0), "port must be an int in 1..65535"),
])
def test_tp_group_rejects_bad_arguments(kwargs, match) -> None:
    kwargs = {"host": "127.0.0.1", "port": 29999, **kwargs}
    with pytest.raises(ValueError, match=match):
        TPGroup.create(**kwargs)
