"""What the blocking and asyncio clients share, so only their call bodies differ."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

from minedraft.client.errors import ServerUnavailable
from minedraft.client.types import CLIENT_TIMEOUT, DEFAULT_TARGET, Timeout
from minedraft.service.security import API_KEY_ENV, DialSecurity, read_token
from minedraft.v1 import generation_pb2_grpc


class ClientBase:
    """One channel to the gateway with its Generation and DrafterPool stubs.

    Subclasses say how to open the channel (`_open_channel`) and whether their calls block or
    are awaited; the target, the default deadline and the stubs are set up here once.

    tls_ca: PEM CA that signed the gateway's certificate (turns on TLS); tls_client_cert and
    tls_client_key: the certificate to present when the gateway demands one (mTLS); api_key:
    sent as `authorization: Bearer <key>` (None: $MINEDRAFT_API_KEY if set; "": none).
    With none of them the channel is plaintext.
    """

    _open_channel: Callable[[DialSecurity, str], Any]  # DialSecurity.channel or .aio_channel

    def __init__(self, target: str = DEFAULT_TARGET, timeout: float | None = 60.0, *,
                 tls_ca: str | None = None, tls_client_cert: str | None = None,
                 tls_client_key: str | None = None, api_key: str | None = None) -> None:
        self.target = target
        self.timeout = timeout  # default deadline in seconds; None = none
        if api_key is None:
            api_key = read_token("", API_KEY_ENV, "api_key")
        self.security = DialSecurity(tls_ca or "", tls_client_cert or "", tls_client_key or "",
                                     api_key)
        self._channel = self._open_channel(self.security, target)
        self._stub = generation_pb2_grpc.GenerationStub(self._channel)
        self._pool = generation_pb2_grpc.DrafterPoolStub(self._channel)

    def _timeout(self, timeout: Timeout) -> float | None:
        return self.timeout if timeout is CLIENT_TIMEOUT else timeout

    def _not_ready(self, timeout: float | None) -> ServerUnavailable:
        return ServerUnavailable(grpc.StatusCode.UNAVAILABLE,
                                 f"server at {self.target} not ready after {timeout}s")
