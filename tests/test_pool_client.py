"""The SDK's drafter-pool calls and `minedraft drafters` against an in-process fake DrafterPool."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest
from fake_servers import FIRST_INFO, UNREACHABLE, FakeDrafterPool, rpc_error, run_cli

from minedraft.client import (AsyncClient, Client, DrafterInfo, InvalidRequest, MineDraftError,
                              NotFound, ServerUnavailable, error_from_rpc)

pytest_plugins = ["fake_servers"]  # the fake gateway's fixtures: server, pool, target, client


# --------------------------------------------------------------------------- sync client

def test_list_register_deregister(client: Client, pool: FakeDrafterPool):
    assert client.drafters() == [FIRST_INFO]
    after_add = client.register_drafter("10.0.0.2:7002")
    assert pool.seen == ["10.0.0.2:7002"]
    assert [d.address for d in after_add] == ["10.0.0.1:7001", "10.0.0.2:7002"]
    added = after_add[1]
    assert isinstance(added, DrafterInfo) and added.num_blocks == 2048 and added.num_requests == 0
    assert client.drafters() == after_add
    assert client.deregister_drafter("10.0.0.1:7001") == [added]
    with pytest.raises(AttributeError):  # frozen
        added.num_blocks = 1  # type: ignore[misc]


def test_errors_carry_server_message(client: Client, pool: FakeDrafterPool):
    with pytest.raises(InvalidRequest) as caught:
        client.register_drafter("no-port")
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.message == "address: expected HOST:PORT, got 'no-port'"
    with pytest.raises(NotFound) as missing:
        client.deregister_drafter("10.0.0.5:7005")
    assert missing.value.code == grpc.StatusCode.NOT_FOUND
    assert missing.value.message == "address: '10.0.0.5:7005' is not in the pool"
    with pytest.raises(ServerUnavailable, match="is not reachable"):
        client.register_drafter(UNREACHABLE)
    pool.ar_mode = True
    with pytest.raises(InvalidRequest, match="ar mode") as precondition:
        client.register_drafter("10.0.0.2:7002")
    assert precondition.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert client.drafters() == [FIRST_INFO]  # nothing changed


def test_not_found_maps_to_not_found():
    error = error_from_rpc(rpc_error(grpc.StatusCode.NOT_FOUND, "gone"))
    assert type(error) is NotFound and isinstance(error, MineDraftError)
    assert (error.code, error.message, str(error)) == (grpc.StatusCode.NOT_FOUND, "gone", "NOT_FOUND: gone")


def test_unreachable_gateway():
    with Client("127.0.0.1:1", timeout=2) as c, pytest.raises(ServerUnavailable):
        c.drafters()


# --------------------------------------------------------------------------- async client

def test_async_pool_calls(target: str, pool: FakeDrafterPool):
    async def scenario() -> None:
        async with AsyncClient(target, timeout=10) as c:
            await c.wait_ready(5)
            assert await c.drafters() == [FIRST_INFO]
            after_add = await c.register_drafter("10.0.0.3:7003")
            assert [d.address for d in after_add] == ["10.0.0.1:7001", "10.0.0.3:7003"]
            assert await c.deregister_drafter("10.0.0.1:7001") == after_add[1:]
            with pytest.raises(InvalidRequest) as caught:
                await c.register_drafter("no-port")
            assert caught.value.message == "address: expected HOST:PORT, got 'no-port'"
            with pytest.raises(NotFound, match="is not in the pool"):
                await c.deregister_drafter("10.0.0.1:7001")
            with pytest.raises(ServerUnavailable):
                await c.register_drafter(UNREACHABLE)

    asyncio.run(scenario())


# --------------------------------------------------------------------------- CLI

def test_cli_list_json(target: str, capsys: pytest.CaptureFixture[str]):
    code, out, _ = run_cli(["drafters", "list", "--server", target, "--json"], capsys)
    assert code == 0
    assert json.loads(out) == {"drafters": [{
        "address": "10.0.0.1:7001", "drafter_id": "0123456789abcdef" * 2, "num_requests": 3,
        "reserved_blocks": 120, "num_blocks": 4096, "requests_assigned": 2**33}]}


def test_cli_list_table(target: str, capsys: pytest.CaptureFixture[str]):
    code, out, _ = run_cli(["drafters", "list", "--server", target], capsys)
    assert code == 0
    header, row = out.splitlines()
    assert header.split() == ["ADDRESS", "ID", "REQUESTS", "BLOCKS", "ASSIGNED"]
    assert row.split() == ["10.0.0.1:7001", "01234567", "3", "120/4096", str(2**33)]


def test_cli_add_and_remove(target: str, pool: FakeDrafterPool, capsys: pytest.CaptureFixture[str]):
    code, out, _ = run_cli(["drafters", "add", "10.0.0.4:7004", "--server", target, "--json"], capsys)
    assert code == 0
    assert [d["address"] for d in json.loads(out)["drafters"]] == ["10.0.0.1:7001", "10.0.0.4:7004"]
    code, out, _ = run_cli(["drafters", "remove", "10.0.0.1:7001", "--server", target], capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "deregistered 10.0.0.1:7001; the pool has 1 drafter(s)"
    assert lines[2].split()[0] == "10.0.0.4:7004" and len(lines) == 3
    assert list(pool.drafters) == ["10.0.0.4:7004"]
    code, out, _ = run_cli(["drafters", "remove", "10.0.0.4:7004", "--server", target], capsys)
    assert (code, out.splitlines()[-1]) == (0, "no drafters in the pool")


def test_cli_errors(target: str, capsys: pytest.CaptureFixture[str]):
    code, out, err = run_cli(["drafters", "remove", "10.0.0.5:7005", "--server", target], capsys)
    assert (code, out) == (1, "")
    assert err == "error: NOT_FOUND: address: '10.0.0.5:7005' is not in the pool\n"
    code, out, err = run_cli(["drafters", "add", "no-port", "--server", target, "--json"], capsys)
    assert (code, out) == (1, "")
    assert err == "error: INVALID_ARGUMENT: address: expected HOST:PORT, got 'no-port'\n"
