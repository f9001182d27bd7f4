"""The tensor-parallel group itself: a group of one whose collectives are identities, the
arguments TPGroup.create refuses before it dials anyone, and a group of two formed on a store
socket bound before its port was handed out."""

from __future__ import annotations

import socket
import threading
import time

import pytest
import torch

from minedraft.parallel import TPGroup
from minedraft.service.network import listening_socket


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


def test_a_listener_is_rank_0s_on_the_port_it_was_given() -> None:
    with listening_socket("127.0.0.1") as sock:
        port = sock.getsockname()[1]
        for rank, given in ((1, port), (0, port + 1 if port < 65535 else port - 1)):
            with pytest.raises(ValueError, match="listener: rank 0's socket"):
                TPGroup.create(rank, 2, "127.0.0.1", given, timeout_s=5, listener=sock)


def test_a_group_forms_on_a_store_socket_bound_before_the_port_was_handed_out() -> None:
    """Rank 0's store takes over a socket already listening: rank 1 may dial before rank 0
    builds its store (it waits in the socket's backlog), and nothing else can bind the port
    meanwhile."""
    sock = listening_socket("127.0.0.1")
    port = sock.getsockname()[1]
    with pytest.raises(OSError):                        # taken from the moment it was handed out
        with socket.socket() as other:
            other.bind(("127.0.0.1", port))
    sums, errors = {}, []

    def join(rank: int) -> None:
        try:
            tp = TPGroup.create(rank, 2, "127.0.0.1", port, timeout_s=30, listener=sock if rank == 0 else None)
            try:
                sums[rank] = tp.all_reduce(torch.full((3,), float(rank + 1))).tolist()
            finally:
                tp.close()
        except Exception as err:       # noqa: BLE001 - reported by the assertion below
            errors.append(err)

    follower = threading.Thread(target=join, args=(1,))
    follower.start()                                    # dials first
    time.sleep(0.2)
    join(0)
    follower.join(timeout=60)
    assert not errors and sums == {0: [3.0] * 3, 1: [3.0] * 3}, errors
