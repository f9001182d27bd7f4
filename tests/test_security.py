"""TLS, mTLS, API keys and the internal token against real grpc.aio servers, with the SDK as client.

The certificates are made here (a deployment CA, a server certificate for 127.0.0.1/localhost,
a client certificate, and a second CA nobody trusts), so no test depends on files in the tree.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import ipaddress
import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from fake_servers import FakeDrafterPool, FakeGeneration, letters, run_cli
from grpc_health.v1 import health_pb2, health_pb2_grpc

from minedraft.client import AsyncClient, Client, MineDraftError, ServerUnavailable, Unauthenticated
from minedraft.service import security
from minedraft.service.auth import proves_membership
from minedraft.service.security import (DialSecurity, SecurityError, ServerSecurity, add_dial_args,
                                        add_server_args, check_bind, is_loopback, read_token, read_tokens)
from minedraft.service.server import start_server
from minedraft.v1 import generation_pb2, generation_pb2_grpc

KEY, OTHER_KEY, INTERNAL = "sk-right-0123456789", "sk-second-key", "deployment-secret-42"


# --------------------------------------------------------------------------- certificates

def _issue(directory: Path, name: str, issuer: tuple | None = None, *, usage=None,
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
    ca = _issue(root, "ca")
    rogue_ca = _issue(root, "rogue-ca")
    _issue(root, "server", ca, usage=ExtendedKeyUsageOID.SERVER_AUTH, sans=[
        x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    _issue(root, "client", ca, usage=ExtendedKeyUsageOID.CLIENT_AUTH)
    _issue(root, "rogue", rogue_ca, usage=ExtendedKeyUsageOID.CLIENT_AUTH)
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


@pytest.fixture(scope="module")
def tls_target(servers: Servers, certs: dict[str, str]) -> str:
    return servers.start(ServerSecurity(certs["server_cert"], certs["server_key"]))


@pytest.fixture(scope="module")
def mtls_target(servers: Servers, certs: dict[str, str]) -> str:
    return servers.start(ServerSecurity(certs["server_cert"], certs["server_key"], certs["ca"]))


@pytest.fixture(scope="module", params=["plaintext", "tls"])
def keyed(request, servers: Servers, certs: dict[str, str]) -> tuple[str, dict[str, str]]:
    """A server demanding API keys -> (target, the Client kwargs its TLS needs)."""
    if request.param == "plaintext":
        return servers.start(ServerSecurity(tokens=(KEY, OTHER_KEY))), {}
    config = ServerSecurity(certs["server_cert"], certs["server_key"], tokens=(KEY, OTHER_KEY))
    return servers.start(config), {"tls_ca": certs["ca"]}


def _served(client: Client) -> None:
    """A unary and a server-streaming call both succeed."""
    assert client.generate("abc", request_id="unary").text
    assert "".join(chunk.text for chunk in client.stream("abc")) == letters(list(b"cba"))


def _refused(client: Client, code: grpc.StatusCode) -> list[MineDraftError]:
    errors = []
    for call in (lambda: client.generate("abc"), lambda: list(client.stream("abc"))):
        with pytest.raises(MineDraftError) as caught:
            call()
        assert caught.value.code == code
        assert code != grpc.StatusCode.UNAUTHENTICATED or isinstance(caught.value, Unauthenticated)
        errors.append(caught.value)
    return errors


# --------------------------------------------------------------------------- TLS and mTLS

def test_tls_served_with_ca_and_refused_in_plaintext(tls_target: str, certs: dict[str, str]):
    with Client(tls_target, timeout=10, tls_ca=certs["ca"]) as client:
        _served(client)
    with Client(tls_target, timeout=5) as plaintext:
        _refused(plaintext, grpc.StatusCode.UNAVAILABLE)
    with Client(tls_target, timeout=5, tls_ca=certs["rogue_ca"]) as wrong_ca:
        _refused(wrong_ca, grpc.StatusCode.UNAVAILABLE)


def test_mtls_needs_a_client_certificate_from_the_ca(mtls_target: str, certs: dict[str, str]):
    with Client(mtls_target, timeout=5, tls_ca=certs["ca"]) as no_cert:
        _refused(no_cert, grpc.StatusCode.UNAVAILABLE)
    with Client(mtls_target, timeout=5, tls_ca=certs["ca"], tls_client_cert=certs["rogue_cert"],
                tls_client_key=certs["rogue_key"]) as rogue:
        _refused(rogue, grpc.StatusCode.UNAVAILABLE)
    with Client(mtls_target, timeout=10, tls_ca=certs["ca"], tls_client_cert=certs["client_cert"],
                tls_client_key=certs["client_key"]) as member:
        _served(member)


# --------------------------------------------------------------------------- API keys

def test_api_key_required_for_unary_and_streaming(keyed, monkeypatch):
    target, tls = keyed
    monkeypatch.delenv(security.API_KEY_ENV, raising=False)
    with Client(target, timeout=10, **tls) as anonymous:
        missing = _refused(anonymous, grpc.StatusCode.UNAUTHENTICATED)
    with Client(target, timeout=10, api_key="sk-wrong", **tls) as wrong:
        rejected = _refused(wrong, grpc.StatusCode.UNAUTHENTICATED)
    for error in missing + rejected:
        assert "\n" not in error.message and KEY not in error.message and "sk-wrong" not in error.message
    assert "missing API key" in missing[0].message and "not accepted" in rejected[0].message
    for key in (KEY, OTHER_KEY):
        with Client(target, timeout=10, api_key=key, **tls) as client:
            _served(client)
            assert client.drafters()


def test_async_client_with_api_key(keyed):
    target, tls = keyed

    async def scenario() -> None:
        async with AsyncClient(target, timeout=10, api_key=KEY, **tls) as client:
            assert (await client.generate("xyz")).text
            assert "".join([chunk.text async for chunk in client.stream("xyz")]) == letters(list(b"zyx"))
        async with AsyncClient(target, timeout=10, api_key="", **tls) as anonymous:
            for call in (anonymous.generate("xyz"), _drain(anonymous.stream("xyz"))):
                with pytest.raises(MineDraftError) as caught:
                    await call
                assert caught.value.code == grpc.StatusCode.UNAUTHENTICATED

    async def _drain(stream) -> list:
        return [chunk async for chunk in stream]

    asyncio.run(scenario())


def test_health_stays_open_without_a_token(keyed, certs: dict[str, str]):
    target, tls = keyed
    channel = DialSecurity(tls.get("tls_ca", "")).channel(target)
    reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    channel.close()


def test_key_from_environment_and_file(keyed, monkeypatch, tmp_path: Path, capsys):
    target, tls = keyed
    monkeypatch.setenv(security.API_KEY_ENV, KEY)
    with Client(target, timeout=10, **tls) as from_env:
        _served(from_env)
    with Client(target, timeout=10, api_key="", **tls) as opted_out:   # "" ignores the variable
        _refused(opted_out, grpc.StatusCode.UNAUTHENTICATED)
    monkeypatch.delenv(security.API_KEY_ENV)
    key_file = tmp_path / "key"
    key_file.write_text(f"# the gateway's key\n\n{KEY}\n")
    tls_flags = ["--tls-ca", tls["tls_ca"]] if tls else []
    argv = ["generate", "abc", "--server", target, *tls_flags]
    assert run_cli([*argv, "--api-key-file", str(key_file)], capsys)[:2] == (0, letters(list(b"cba")) + "\n")
    code, _, err = run_cli(argv, capsys)
    assert code == 1 and "UNAUTHENTICATED: missing API key" in err
    code, out, _ = run_cli(["drafters", "list", "--server", target, "--api-key-file", str(key_file),
                            *tls_flags], capsys)
    assert code == 0 and "10.0.0.1:7001" in out


def test_server_keys_from_file_or_environment(tmp_path: Path, monkeypatch):
    monkeypatch.setenv(security.API_KEYS_ENV, f"{KEY}, {OTHER_KEY}")
    assert read_tokens("", security.API_KEYS_ENV, "--api-key-file") == (KEY, OTHER_KEY)
    keys = tmp_path / "keys"
    keys.write_text(f"{OTHER_KEY}\n# old: {KEY}\n")
    assert read_tokens(str(keys), security.API_KEYS_ENV, "--api-key-file") == (OTHER_KEY,)
    parser = argparse.ArgumentParser()
    add_server_args(parser, public=True)
    config = ServerSecurity.from_args(parser.parse_args(["--api-key-file", str(keys)]))
    assert config.tokens == (OTHER_KEY,) and OTHER_KEY not in repr(config)
    keys.write_text("\n# nothing\n")
    with pytest.raises(SecurityError, match=f"--api-key-file: {keys} holds no keys"):
        read_tokens(str(keys), security.API_KEYS_ENV, "--api-key-file")
    with pytest.raises(SecurityError, match="holds 2 keys"):
        read_token("", security.API_KEYS_ENV, "--api-key-file")


def test_no_flag_takes_a_secret(capsys):
    parsers = [argparse.ArgumentParser() for _ in range(4)]
    add_server_args(parsers[0], public=True)
    add_server_args(parsers[1], public=False)
    add_dial_args(parsers[2], internal=True)
    add_dial_args(parsers[3], internal=False)
    flags = [flag for parser in parsers for action in parser._actions for flag in action.option_strings]
    for command in (["generate", "--help"], ["drafters", "list", "--help"]):
        with pytest.raises(SystemExit):
            run_cli(command, capsys)
        flags += [word.strip(",") for word in capsys.readouterr().out.split() if word.startswith("--")]
    secret_flags = {flag for flag in flags if ("key" in flag or "token" in flag) and flag != "--max-tokens"}
    assert {"--api-key-file", "--internal-token-file", "--tls-key", "--tls-client-key"} == secret_flags


# --------------------------------------------------------------------------- internal token

def test_internal_token_and_membership_proof(servers: Servers):
    member = servers.start(ServerSecurity(tokens=(INTERNAL,), internal=True))
    outsider = servers.start(ServerSecurity())

    async def scenario() -> None:
        gateway = DialSecurity(token=INTERNAL)
        async with gateway.aio_channel(member) as channel:
            assert await proves_membership(channel, INTERNAL, timeout=10)
            assert not await proves_membership(channel, "another-deployment", timeout=10)
            info = await generation_pb2_grpc.GenerationStub(channel).GetServerInfo(
                generation_pb2.ServerInfoRequest(), timeout=10)
            assert info.mode == "sd"
        async with gateway.aio_channel(outsider) as channel:
            assert not await proves_membership(channel, INTERNAL, timeout=10)
        async with DialSecurity().aio_channel(member) as channel:
            with pytest.raises(grpc.aio.AioRpcError, match="missing internal token"):
                await generation_pb2_grpc.GenerationStub(channel).GetServerInfo(
                    generation_pb2.ServerInfoRequest(), timeout=10)
        async with gateway.aio_channel("127.0.0.1:1") as channel:
            assert not await proves_membership(channel, INTERNAL, timeout=2)

    asyncio.run(scenario())


# --------------------------------------------------------------------------- binding and config

def test_is_loopback():
    assert all(map(is_loopback, ["127.0.0.1", "127.8.0.1", "localhost", "::1", "[::1]"]))
    assert not any(map(is_loopback, ["0.0.0.0", "::", "", "10.1.2.3", "example.com"]))


def test_public_bind_beyond_loopback(certs: dict[str, str], caplog):
    open_config = ServerSecurity()
    check_bind("127.0.0.1", open_config, insecure=False)
    with pytest.raises(SecurityError, match="--insecure"):
        check_bind("0.0.0.0", open_config, insecure=False)
    with caplog.at_level(logging.WARNING, logger=security.__name__):
        check_bind("0.0.0.0", open_config, insecure=True)
    assert "open to anyone" in caplog.text and "--insecure" in caplog.text
    check_bind("0.0.0.0", ServerSecurity(tokens=(KEY,)), insecure=False)
    check_bind("10.0.0.1", ServerSecurity(certs["server_cert"], certs["server_key"]), insecure=False)


def test_token_in_plaintext_beyond_loopback_warns(caplog):
    with caplog.at_level(logging.WARNING, logger=security.__name__):
        DialSecurity(token=KEY).channel("127.0.0.1:1").close()
        assert not caplog.text
        DialSecurity(token=KEY).channel("10.0.0.9:50051").close()
    assert "without TLS" in caplog.text and KEY not in caplog.text


def test_config_errors_name_the_flag(certs: dict[str, str], tmp_path: Path, capsys):
    cases = [(lambda: ServerSecurity(key_file=certs["server_key"]), "--tls-cert and --tls-key"),
             (lambda: ServerSecurity(client_ca_file=certs["ca"]), "--tls-client-ca needs --tls-cert"),
             (lambda: ServerSecurity(certs["server_cert"], str(tmp_path / "nope")), "--tls-key: no such file"),
             (lambda: DialSecurity(client_cert_file=certs["client_cert"], client_key_file=certs["client_key"]),
              "--tls-client-cert needs --tls-ca"),
             (lambda: DialSecurity(certs["ca"], client_cert_file=certs["client_cert"]), "--tls-client-key"),
             (lambda: DialSecurity(str(tmp_path / "ca.pem")), "--tls-ca: no such file"),
             (lambda: Client("localhost:1", api_key="two words"), "printable ASCII")]
    for make, message in cases:
        with pytest.raises(SecurityError, match=message):
            make()
    code, _, err = run_cli(["generate", "p", "--tls-ca", str(tmp_path / "missing.pem")], capsys)
    assert code == 2 and "--tls-ca: no such file" in err
    with pytest.raises(ServerUnavailable):      # plaintext to a closed port: nothing changed
        Client("127.0.0.1:1", timeout=2, api_key="").generate("x")
