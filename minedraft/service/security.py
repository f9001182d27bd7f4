"""Credentials and authentication: TLS/mTLS certificates, bearer tokens (the public API keys and
the deployment's internal token), and the start-up check that keeps an open API on loopback.
Secrets come from files or the environment, never from the command line (any user of the host
can read that in the process list). docs/security.md shows the whole picture."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio

from minedraft.service.auth import AIO_BEARERS, BearerTokenInterceptor, SyncBearer

logger = logging.getLogger(__name__)

API_KEYS_ENV = "MINEDRAFT_API_KEYS"              # keys a gateway accepts, comma-separated
API_KEY_ENV = "MINEDRAFT_API_KEY"                # the key the SDK and CLI send
INTERNAL_TOKEN_ENV = "MINEDRAFT_INTERNAL_TOKEN"  # the secret the services of one deployment share


class SecurityError(ValueError):
    """A security option that cannot work, or an unprotected bind; the message names the flag."""


def _check_files(*paths_and_flags: tuple[str, str]) -> None:
    for path, flag in paths_and_flags:
        if path and not os.path.isfile(path):
            raise SecurityError(f"{flag}: no such file: {path}")


def _check_pair(cert: str, key: str, cert_flag: str, key_flag: str) -> None:
    if bool(cert) != bool(key):
        raise SecurityError(f"{cert_flag} and {key_flag} go together: give both or neither")
    _check_files((cert, cert_flag), (key, key_flag))


def _check_token(token: str, source: str) -> None:
    if token and not all(33 <= ord(c) <= 126 for c in token):
        raise SecurityError(f"{source}: a key must be printable ASCII without spaces")


def read_tokens(path: str, env: str, flag: str) -> tuple[str, ...]:
    """Tokens from `path` (one per line; blank lines and # comments skipped) or, without a file,
    from the environment variable `env` (separated by commas or whitespace)."""
    if path:
        _check_files((path, flag))
        if os.stat(path).st_mode & 0o077:
            logger.warning("%s %s is readable by other users; chmod 600 it", flag, path)
        with open(path) as f:
            tokens = tuple(line.strip() for line in f if line.strip() and not line.startswith("#"))
        if not tokens:
            raise SecurityError(f"{flag}: {path} holds no keys")
    else:
        tokens = tuple(os.environ.get(env, "").replace(",", " ").split())
    for token in tokens:
        _check_token(token, f"{flag} {path}" if path else f"${env}")
    return tokens


def read_token(path: str, env: str, flag: str) -> str:
    """The one token a client presents, from `path` or `env` as for read_tokens ('' if none)."""
    tokens = read_tokens(path, env, flag)
    if len(tokens) > 1:
        raise SecurityError(f"{flag} / ${env}: holds {len(tokens)} keys; a client sends one")
    return tokens[0] if tokens else ""


def _pem(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


@dataclass(frozen=True)
class ServerSecurity:
    """What a server presents and demands: a certificate turns on TLS, a client CA mTLS, tokens
    bearer authentication (API keys on the public API, the internal token on a service)."""

    cert_file: str = ""
    key_file: str = ""
    client_ca_file: str = ""           # given: clients must present a certificate it signed
    tokens: tuple[str, ...] = field(default=(), repr=False)
    internal: bool = False             # tokens are the internal token: answer membership checks

    def __post_init__(self) -> None:
        _check_pair(self.cert_file, self.key_file, "--tls-cert", "--tls-key")
        if self.client_ca_file and not self.cert_file:
            raise SecurityError("--tls-client-ca needs --tls-cert and --tls-key (mTLS runs over TLS)")
        _check_files((self.client_ca_file, "--tls-client-ca"))

    @classmethod
    def from_args(cls, args: argparse.Namespace, *, internal: bool = False) -> ServerSecurity:
        """From add_server_args' flags; internal: the token is add_dial_args' --internal-token-file."""
        if internal:
            token = read_token(args.internal_token_file, INTERNAL_TOKEN_ENV, "--internal-token-file")
            tokens = (token,) if token else ()
        else:
            tokens = read_tokens(args.api_key_file, API_KEYS_ENV, "--api-key-file")
        return cls(args.tls_cert, args.tls_key, args.tls_client_ca, tokens, internal)

    @property
    def tls(self) -> bool:
        return bool(self.cert_file)

    def credentials(self) -> grpc.ServerCredentials | None:
        """For start_server(credentials=...); None: plaintext."""
        if not self.tls:
            return None
        client_ca = _pem(self.client_ca_file) if self.client_ca_file else None
        return grpc.ssl_server_credentials([(_pem(self.key_file), _pem(self.cert_file))],
                                           root_certificates=client_ca,
                                           require_client_auth=client_ca is not None)

    def interceptors(self) -> list[grpc.aio.ServerInterceptor]:
        """For start_server(interceptors=...); empty without tokens."""
        return [BearerTokenInterceptor(self.tokens, internal=self.internal)] if self.tokens else []


@dataclass(frozen=True)
class DialSecurity:
    """What a client dials with: a CA turns on TLS, a client certificate mTLS; a token goes as
    `authorization: Bearer <token>` on every call but health checks."""

    ca_file: str = ""
    client_cert_file: str = ""
    client_key_file: str = ""
    token: str = field(default="", repr=False)

    def __post_init__(self) -> None:
        _check_pair(self.client_cert_file, self.client_key_file, "--tls-client-cert", "--tls-client-key")
        if self.client_cert_file and not self.ca_file:
            raise SecurityError("--tls-client-cert needs --tls-ca (mTLS runs over TLS)")
        _check_files((self.ca_file, "--tls-ca"))
        _check_token(self.token, "API key / token")

    @classmethod
    def from_args(cls, args: argparse.Namespace, *, internal: bool = False) -> DialSecurity:
        """From add_dial_args' flags (internal: the token is --internal-token-file's)."""
        token = (read_token(args.internal_token_file, INTERNAL_TOKEN_ENV, "--internal-token-file")
                 if internal else read_token(args.api_key_file, API_KEY_ENV, "--api-key-file"))
        return cls(args.tls_ca, args.tls_client_cert, args.tls_client_key, token)

    @property
    def tls(self) -> bool:
        return bool(self.ca_file)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        client = ((_pem(self.client_key_file), _pem(self.client_cert_file))
                  if self.client_cert_file else (None, None))
        return grpc.ssl_channel_credentials(_pem(self.ca_file), *client)

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """The token as call metadata, for callers that pass metadata= themselves."""
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()

    def _warn_plaintext(self, address: str) -> None:
        host = address if address.startswith("unix") else address.split("///")[-1].rpartition(":")[0]
        if self.token and not self.tls and not is_loopback(host):
            logger.warning("sending a bearer token to %s without TLS: anyone on the path can read"
                           " it (give --tls-ca)", address)

    def channel(self, address: str, options: Sequence[tuple[str, Any]] = ()) -> grpc.Channel:
        """A blocking channel: TLS when configured, the token added to each call."""
        self._warn_plaintext(address)
        channel = (grpc.secure_channel(address, self.channel_credentials(), options=options)
                   if self.tls else grpc.insecure_channel(address, options=options))
        return grpc.intercept_channel(channel, SyncBearer(self.metadata())) if self.token else channel

    def aio_channel(self, address: str, options: Sequence[tuple[str, Any]] = ()) -> grpc.aio.Channel:
        """An asyncio channel: TLS when configured, the token added to each call."""
        self._warn_plaintext(address)
        interceptors = [bearer(self.metadata()) for bearer in AIO_BEARERS] if self.token else None
        if self.tls:
            return grpc.aio.secure_channel(address, self.channel_credentials(), options=options,
                                           interceptors=interceptors)
        return grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)


def is_loopback(host: str) -> bool:
    """Whether `host` (a name or address, IPv6 optionally in brackets) is this machine only."""
    host = host.strip("[]")
    if host == "localhost" or host.startswith("unix:"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, security: ServerSecurity, insecure: bool) -> None:
    """Refuse to serve the public API beyond loopback with neither TLS nor API keys unless
    `insecure`; with it, log a WARNING saying the API is open."""
    if is_loopback(host) or security.tls or security.tokens:
        return
    message = (f"the public API on {host} would be open to anyone who can reach it: no TLS "
               f"(--tls-cert/--tls-key) and no API keys (--api-key-file or ${API_KEYS_ENV})")
    if not insecure:
        raise SecurityError(f"{message}; pass --insecure to serve it like this anyway")
    logger.warning("%s; serving anyway because of --insecure", message)


def add_server_args(parser: argparse.ArgumentParser, *, public: bool) -> None:
    """A server's TLS flags; public: also --api-key-file (the keys it accepts) and --insecure."""
    group = parser.add_argument_group("TLS and authentication (serving)")
    group.add_argument("--tls-cert", default="", metavar="FILE", help="PEM certificate to serve with (turns on TLS)")
    group.add_argument("--tls-key", default="", metavar="FILE", help="PEM private key of --tls-cert")
    group.add_argument("--tls-client-ca", default="", metavar="FILE",
                       help="PEM CA: clients must present a certificate it signed (mTLS)")
    if public:
        group.add_argument("--api-key-file", default="", metavar="FILE",
                           help=f"API keys accepted, one per line (default: ${API_KEYS_ENV}, "
                                "comma-separated); clients send 'authorization: Bearer KEY'")
        group.add_argument("--insecure", action="store_true",
                           help="serve a non-loopback address with neither TLS nor API keys")


def add_internal_token_arg(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """--internal-token-file: for services that demand the deployment's token (and present it)."""
    parser.add_argument("--internal-token-file", default="", metavar="FILE",
                        help=f"the deployment's shared secret (default: ${INTERNAL_TOKEN_ENV}); "
                             "services demand it of each other and present it")


def add_dial_args(parser: argparse.ArgumentParser, *, internal: bool) -> None:
    """A client's TLS flags and its token: --api-key-file, or --internal-token-file (internal)."""
    group = parser.add_argument_group("TLS and authentication (dialing)")
    group.add_argument("--tls-ca", default="", metavar="FILE",
                       help="PEM CA that signed the server's certificate (turns on TLS)")
    group.add_argument("--tls-client-cert", default="", metavar="FILE", help="PEM certificate to present (mTLS)")
    group.add_argument("--tls-client-key", default="", metavar="FILE", help="PEM private key of --tls-client-cert")
    if internal:
        add_internal_token_arg(group)
    else:
        group.add_argument("--api-key-file", default="", metavar="FILE",
                           help=f"file holding the API key to send (default: ${API_KEY_ENV})")
