"""API keys and the internal token against real grpc.aio servers, with the SDK and the CLI as
clients: keys are required on unary and streaming calls alike (over plaintext and TLS), come
from the environment or files but never from a flag, leave health open, and the internal token
proves membership of one deployment."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import grpc
import pytest
from fake_servers import letters, run_cli
from grpc_health.v1 import health_pb2, health_pb2_grpc
from security_helpers import INTERNAL, KEY, OTHER_KEY, Servers, assert_refused, assert_served

from minedraft.client import AsyncClient, Client, MineDraftError
from minedraft.service import security
from minedraft.service.auth import proves_membership
from minedraft.service.security import (DialSecurity, SecurityError, ServerSecurity, add_dial_args,
                                        add_server_args, read_token, read_tokens)
from minedraft.v1 import generation_pb2, generation_pb2_grpc

pytest_plugins = ["security_helpers"]  # certs, servers


@pytest.fixture(scope="module", params=["plaintext", "tls"])
def keyed(request, servers: Servers, certs: dict[str, str]) -> tuple[str, dict[str, str]]:
    """A server demanding API keys -> (target, the Client kwargs its TLS needs)."""
    if request.param == "plaintext":
        return servers.start(ServerSecurity(tokens=(KEY, OTHER_KEY))), {}
    config = ServerSecurity(certs["server_cert"], certs["server_key"], tokens=(KEY, OTHER_KEY))
    return servers.start(config), {"tls_ca": certs["ca"]}


def test_api_key_required_for_unary_and_streaming(keyed, monkeypatch):
    target, tls = keyed
    monkeypatch.delenv(security.API_KEY_ENV, raising=False)
    with Client(target, timeout=10, **tls) as anonymous:
        missing = assert_refused(anonymous, grpc.StatusCode.UNAUTHENTICATED)
    with Client(target, timeout=10, api_key="sk-wrong", **tls) as wrong:
        rejected = assert_refused(wrong, grpc.StatusCode.UNAUTHENTICATED)
    for error in missing + rejected:
        assert "\n" not in error.message and KEY not in error.message and "sk-wrong" not in error.message
    assert "missing API key" in missing[0].message and "not accepted" in rejected[0].message
    for key in (KEY, OTHER_KEY):
        with Client(target, timeout=10, api_key=key, **tls) as client:
            assert_served(client)
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
        assert_served(from_env)
    with Client(target, timeout=10, api_key="", **tls) as opted_out:   # "" ignores the variable
        assert_refused(opted_out, grpc.StatusCode.UNAUTHENTICATED)
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
