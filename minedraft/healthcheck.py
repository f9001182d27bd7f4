"""`python -m minedraft.healthcheck HOST:PORT [--service NAME] [--timeout S]`.

Exits 0 when the server reports SERVING over the standard gRPC health protocol, 1 otherwise.
Container HEALTHCHECKs and compose's `service_healthy` need a probe that speaks that protocol
from inside the image, without curl or a separate probe binary. It imports no torch, so it
stays cheap to run every few seconds.
"""

from __future__ import annotations

import argparse
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from minedraft.service.security import DialSecurity, SecurityError

SERVING = health_pb2.HealthCheckResponse.SERVING


def check(address: str, service: str = "", timeout_s: float = 3.0, dial: DialSecurity | None = None) -> str:
    """-> the status name the server reports for `service` ("" is the whole server), or
    the gRPC error code's name when the call fails (no server, timeout, unknown service).
    dial: TLS (and a client certificate under mTLS) for a server that serves TLS."""
    with (dial or DialSecurity()).channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        except grpc.RpcError as error:
            return error.code().name
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


class _Parser(argparse.ArgumentParser):
    """Usage errors exit 1, not argparse's 2: Docker reserves a HEALTHCHECK exit code of 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(1, f"{self.prog}: error: {message}\n")


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="python -m minedraft.healthcheck",
                     description="Exit 0 if a gRPC server reports SERVING, else 1.")
    parser.add_argument("address", help="HOST:PORT of the server")
    parser.add_argument("--service", default="", help="service name to ask about (default: the server)")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for the answer")
    parser.add_argument("--tls-ca", default="", metavar="FILE", help="PEM CA of a TLS server's certificate")
    parser.add_argument("--tls-client-cert", default="", metavar="FILE", help="PEM certificate to present (mTLS)")
    parser.add_argument("--tls-client-key", default="", metavar="FILE", help="PEM key of --tls-client-cert")
    args = parser.parse_args(argv)
    try:
        dial = DialSecurity(args.tls_ca, args.tls_client_cert, args.tls_client_key)
    except SecurityError as err:
        parser.error(str(err))
    status = check(args.address, args.service, args.timeout, dial)
    print(f"{args.address} {args.service or '(server)'}: {status}")
    return 0 if status == "SERVING" else 1


if __name__ == "__main__":
    sys.exit(main())
