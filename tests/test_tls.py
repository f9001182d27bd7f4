"""TLS and mTLS against real grpc.aio servers, with the SDK as client: a server certificate is
trusted only through its CA, and under mTLS only clients with a certificate from that CA are served."""

from __future__ import annotations

import grpc
import pytest
from security_helpers import Servers, assert_refused, assert_served

from minedraft.client import Client
from minedraft.service.security import ServerSecurity

pytest_plugins = ["security_helpers"]  # certs, servers


@pytest.fixture(scope="module")
def tls_target(servers: Servers, certs: dict[str, str]) -> str:
    return servers.start(ServerSecurity(certs["server_cert"], certs["server_key"]))


@pytest.fixture(scope="module")
def mtls_target(servers: Servers, certs: dict[str, str]) -> str:
    return servers.start(ServerSecurity(certs["server_cert"], certs["server_key"], certs["ca"]))


def test_tls_served_with_ca_and_refused_in_plaintext(tls_target: str, certs: dict[str, str]):
    with Client(tls_target, timeout=10, tls_ca=certs["ca"]) as client:
        assert_served(client)
    with Client(tls_target, timeout=5) as plaintext:
        assert_refused(plaintext, grpc.StatusCode.UNAVAILABLE)
    with Client(tls_target, timeout=5, tls_ca=certs["rogue_ca"]) as wrong_ca:
        assert_refused(wrong_ca, grpc.StatusCode.UNAVAILABLE)


def test_mtls_needs_a_client_certificate_from_the_ca(mtls_target: str, certs: dict[str, str]):
    with Client(mtls_target, timeout=5, tls_ca=certs["ca"]) as no_cert:
        assert_refused(no_cert, grpc.StatusCode.UNAVAILABLE)
    with Client(mtls_target, timeout=5, tls_ca=certs["ca"], tls_client_cert=certs["rogue_cert"],
                tls_client_key=certs["rogue_key"]) as rogue:
        assert_refused(rogue, grpc.StatusCode.UNAVAILABLE)
    with Client(mtls_target, timeout=10, tls_ca=certs["ca"], tls_client_cert=certs["client_cert"],
                tls_client_key=certs["client_key"]) as member:
        assert_served(member)


def test_healthcheck_probe_speaks_tls(tls_target: str, mtls_target: str, certs: dict[str, str]):
    """The container probe reaches TLS services with --tls-ca (and a client certificate
    under mTLS); in plaintext it reports them unhealthy."""
    from minedraft.healthcheck import main

    assert main([tls_target, "--timeout", "5"]) == 1
    assert main([tls_target, "--tls-ca", certs["ca"], "--timeout", "5"]) == 0
    assert main([mtls_target, "--tls-ca", certs["ca"], "--timeout", "5"]) == 1
    assert main([mtls_target, "--tls-ca", certs["ca"], "--tls-client-cert", certs["client_cert"],
                 "--tls-client-key", certs["client_key"], "--timeout", "5"]) == 0
