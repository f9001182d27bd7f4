"""What the blocking and asyncio clients share, so only their call bodies differ."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

from minedraft.client.errors import ServerUnavailable
from minedraft.client.types import CLIENT_TIMEOUT, DEFAULT_TARGET, Timeout
from minedraft.v1 import generation_pb2_grpc


class ClientBase:
    """One channel to the gateway with its Generation and DrafterPool stubs.

    Subclasses say how to open the channel (`_open_channel`) and whether their calls block or
    are awaited; the target, the default deadline and the stubs are set up here once.
    """

    _open_channel: Callable[[str], Any]  # grpc.insecure_channel or grpc.aio.insecure_channel

    def __init__(self, target: str = DEFAULT_TARGET, timeout: float | None = 60.0) -> None:
        self.target = target
        self.timeout = timeout  # default deadline in seconds; None = none
        self._channel = self._open_channel(target)
        self._stub = generation_pb2_grpc.GenerationStub(self._channel)
        self._pool = generation_pb2_grpc.DrafterPoolStub(self._channel)

    def _timeout(self, timeout: Timeout) -> float | None:
        return self.timeout if timeout is CLIENT_TIMEOUT else timeout

    def _not_ready(self, timeout: float | None) -> ServerUnavailable:
        return ServerUnavailable(grpc.StatusCode.UNAVAILABLE,
                                 f"server at {self.target} not ready after {timeout}s")
