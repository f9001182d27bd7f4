"""What the security tests share: certificates made here (a deployment CA, a server certificate
for 127.0.0.1/localhost, a client certificate, and a second CA nobody trusts), so no test depends
on files in the tree; real grpc.aio servers with the fake gateway's servicers; and what a client
sees when it is served or refused.

Test modules load it with ``pytest_plugins = ["security_helpers"]`` for its fixtures (`certs`,
`servers`); each module still gets its own servers.
They also import its names first, so pytest cannot rewrite its asserts: PYTEST_DONT_REWRITE.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from fake_servers import FakeDrafterPool, FakeGeneration, letters

from minedraft.client import Client, MineDraftError, Unauthenticated
from minedraft.service.security import ServerSecurity
from minedraft.service.server import start_server
from minedraft.v1 import generation_pb2_grpc

KEY, OTHER_KEY, INTERNAL = "sk-right-0123456789", "sk-second-key", "deployment-secret-42"


# --------------------------------------------------------------------------- certificates

def issue(directory: Path, name: str, issuer: tuple | None = None, *, usage=None,
          sans: list | None = None) -> tuple:
    """Write NAME.pem and NAME.key: a CA when issuer is None, else a leaf it signs."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    issuer_key, issuer_cert = issuer or (key, None)
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(subject)
               .issuer_name(issuer_cert.subject if issuer_cert else subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(hours=1))
               .not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True))
    if issuer is None:
        builder = builder.add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
            key_encipherment=False, data_encipherment=False, key_agreement=False,
            encipher_only=False, decipher_only=False), critical=True)
    else:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(issuer_key, hashes.SHA256())
    (directory / f"{name}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file = directory / f"{name}.key"
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    key_file.chmod(0o600)
    return key, cert


@pytest.fixture(scope="session")
def certs(tmp_path_factory) -> dict[str, str]:
    """Paths: ca, server_cert/key (127.0.0.1, localhost), client_cert/key, rogue_cert/key."""
    root = tmp_path_factory.mktemp("certs")
    ca = issue(root, "ca")
    rogue_ca = issue(root, "rogue-ca")
    issue(root, "server", ca, usage=ExtendedKeyUsageOID.SERVER_AUTH, sans=[
        x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    issue(root, "client", ca, usage=ExtendedKeyUsageOID.CLIENT_AUTH)
    issue(root, "rogue", rogue_ca, usage=ExtendedKeyUsageOID.CLIENT_AUTH)
    return {"ca": str(root / "ca.pem"), "rogue_ca": str(root / "rogue-ca.pem"),
            **{f"{who}_{part}": str(root / f"{who}.{ext}") for who in ("server", "client", "rogue")
               for part, ext in (("cert", "pem"), ("key", "key"))}}


# --------------------------------------------------------------------------- servers

class Servers:
    """Real start_server servers with the fake gateway's servicers, on one background loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.served: list = []

    def start(self, config: ServerSecurity) -> str:
        def add(server: grpc.aio.Server) -> None:
            generation_pb2_grpc.add_GenerationServicer_to_server(FakeGeneration(), server)
            generation_pb2_grpc.add_DrafterPoolServicer_to_server(FakeDrafterPool(), server)

        started = start_server(add, "127.0.0.1", 0, ["minedraft.v1.Generation"],
                               credentials=config.credentials(), interceptors=config.interceptors())
        served = asyncio.run_coroutine_threadsafe(started, self.loop).result(10)
        self.served.append(served)
        return f"127.0.0.1:{served.port}"

    def stop(self) -> None:
        for served in self.served:
            asyncio.run_coroutine_threadsafe(served.server.stop(None), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    running = Servers()
    yield running
    running.stop()


def assert_served(client: Client) -> None:
    """A unary and a server-streaming call both succeed."""
    assert client.generate("abc", request_id="unary").text
    assert "".join(chunk.text for chunk in client.stream("abc")) == letters(list(b"cba"))


def assert_refused(client: Client, code: grpc.StatusCode) -> list[MineDraftError]:
    errors = []
    for call in (lambda: client.generate("abc"), lambda: list(client.stream("abc"))):
        with pytest.raises(MineDraftError) as caught:
            call()
        assert caught.value.code == code
        assert code != grpc.StatusCode.UNAUTHENTICATED or isinstance(caught.value, Unauthenticated)
        errors.append(caught.value)
    return errors
