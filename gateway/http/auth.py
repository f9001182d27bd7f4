"""The public API's keys on HTTP: `Authorization: Bearer <key>`, as the gRPC port takes them
(minedraft/service/auth.py), compared in constant time."""

from __future__ import annotations

import hmac
from collections.abc import Sequence

import grpc

from gateway.frontend import RequestError


class ApiKeys:
    """No keys: every caller is served (check_bind keeps such a port on loopback)."""

    def __init__(self, keys: Sequence[str]) -> None:
        self._keys = tuple(key.encode() for key in keys)

    def check(self, authorization: str | None) -> None:
        """Raises UNAUTHENTICATED unless the header names one of the keys."""
        if not self._keys:
            return
        if not authorization:
            raise RequestError(grpc.StatusCode.UNAUTHENTICATED,
                               "missing API key: send the header 'Authorization: Bearer <key>'")
        scheme, _, presented = authorization.partition(" ")
        matched = False
        for key in self._keys:      # no early exit: the time taken says nothing about which key
            matched |= hmac.compare_digest(presented.strip().encode(), key)
        if not (matched and scheme.lower() == "bearer"):
            raise RequestError(grpc.StatusCode.UNAUTHENTICATED, "API key not accepted")
