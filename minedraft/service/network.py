"""Ports and host names: what a service binds and what its peers dial."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port free right now, for a rendezvous address handed to child processes at once.
    Another bind can take it before they do; a service's own port is better bound as 0."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def advertised_host(bind_host: str, advertise: str = "") -> str:
    """The host name peers should dial: the bind address unless it is a wildcard, in which
    case (or with 'auto') this machine's address as its own resolver sees it."""
    if advertise and advertise != "auto":
        return advertise
    if not advertise and bind_host not in ("0.0.0.0", "::", "[::]", ""):
        return bind_host
    name = socket.gethostname()
    try:
        return socket.gethostbyname(name)
    except OSError:
        return name
