"""Ports and host names: what a service binds and what its peers dial."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port free right now, for a rendezvous address handed to child processes at once.
    Another bind can take it before they do; a service's own port is better bound as 0."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def listening_socket(host: str, port: int = 0) -> socket.socket:
    """A socket listening on `host` only (port 0: any free port), for a rendezvous store to
    take over. Bound before anyone is told its port, so no other bind can take the port in
    between, as one picked by free_port can."""
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host.strip("[]"), port))
    sock.listen(128)
    return sock


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
