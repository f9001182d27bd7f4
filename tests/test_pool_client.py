"""The SDK's drafter-pool calls and `minedraft drafters` against an in-process fake DrafterPool."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator

import grpc
import grpc.aio
import pytest
from test_client import ServerThread, rpc_error

from minedraft import cli
from minedraft.client import (AsyncClient, Client, DrafterInfo, InvalidRequest, MineDraftError,
                              NotFound, ServerUnavailable, error_from_rpc)
from minedraft.v1 import generation_pb2, generation_pb2_grpc

FIRST = generation_pb2.DrafterStatus(address="10.0.0.1:7001", drafter_id="0123456789abcdef" * 2,
                                     num_requests=3, reserved_blocks=120, num_blocks=4096,
                                     requests_assigned=2**33)
FIRST_INFO = DrafterInfo(address="10.0.0.1:7001", drafter_id="0123456789abcdef" * 2, num_requests=3,
                         reserved_blocks=120, num_blocks=4096, requests_assigned=2**33)
UNREACHABLE = "10.0.0.9:7009"


class FakeDrafterPool(generation_pb2_grpc.DrafterPoolServicer):
    """The gateway's pool answers and error codes (gateway/servicer.py), without drafters."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self.drafters: dict[str, generation_pb2.DrafterStatus] = {FIRST.address: FIRST}
            self.ar_mode = False
            self.seen: list[str] = []

    def _status(self) -> generation_pb2.PoolStatus:
        with self._lock:
            return generation_pb2.PoolStatus(drafters=list(self.drafters.values()))

    async def _check_mode(self, request: generation_pb2.DrafterEndpoint, context) -> None:
        self.seen.append(request.address)
        if self.ar_mode:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                "this gateway runs in ar mode: no drafters")

    async def Register(self, request, context):
        await self._check_mode(request, context)
        address = request.address
        if ":" not in address:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"address: expected HOST:PORT, got {address!r}")
        if address == UNREACHABLE:
            await context.abort(grpc.StatusCode.UNAVAILABLE,
                                f"address: drafter {address} is not reachable: timed out")
        with self._lock:
            self.drafters.setdefault(address, generation_pb2.DrafterStatus(
                address=address, drafter_id=f"{len(self.drafters):032x}", num_blocks=2048))
        return self._status()

    async def Deregister(self, request, context):
        await self._check_mode(request, context)
        with self._lock:
            found = self.drafters.pop(request.address, None)
        if found is None:
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                f"address: {request.address!r} is not in the pool")
        return self._status()

    async def List(self, request, context):
        return self._status()


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    thread = ServerThread(FakeDrafterPool(), generation_pb2_grpc.add_DrafterPoolServicer_to_server)
    thread.start()
    yield thread
    thread.stop()


@pytest.fixture
def pool(server: ServerThread) -> FakeDrafterPool:
    server.servicer.reset()
    return server.servicer


@pytest.fixture
def target(server: ServerThread, pool: FakeDrafterPool) -> str:
    return f"127.0.0.1:{server.port}"


@pytest.fixture
def client(target: str) -> Iterator[Client]:
    with Client(target, timeout=10) as c:
        c.wait_ready(5)
        yield c


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

def _run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_list_json(target: str, capsys: pytest.CaptureFixture[str]):
    code, out, _ = _run_cli(["drafters", "list", "--server", target, "--json"], capsys)
    assert code == 0
    assert json.loads(out) == {"drafters": [{
        "address": "10.0.0.1:7001", "drafter_id": "0123456789abcdef" * 2, "num_requests": 3,
        "reserved_blocks": 120, "num_blocks": 4096, "requests_assigned": 2**33}]}


def test_cli_list_table(target: str, capsys: pytest.CaptureFixture[str]):
    code, out, _ = _run_cli(["drafters", "list", "--server", target], capsys)
    assert code == 0
    header, row = out.splitlines()
    assert header.split() == ["ADDRESS", "ID", "REQUESTS", "BLOCKS", "ASSIGNED"]
    assert row.split() == ["10.0.0.1:7001", "01234567", "3", "120/4096", str(2**33)]


def test_cli_add_and_remove(target: str, pool: FakeDrafterPool, capsys: pytest.CaptureFixture[str]):
    code, out, _ = _run_cli(["drafters", "add", "10.0.0.4:7004", "--server", target, "--json"], capsys)
    assert code == 0
    assert [d["address"] for d in json.loads(out)["drafters"]] == ["10.0.0.1:7001", "10.0.0.4:7004"]
    code, out, _ = _run_cli(["drafters", "remove", "10.0.0.1:7001", "--server", target], capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "deregistered 10.0.0.1:7001; the pool has 1 drafter(s)"
    assert lines[2].split()[0] == "10.0.0.4:7004" and len(lines) == 3
    assert list(pool.drafters) == ["10.0.0.4:7004"]
    code, out, _ = _run_cli(["drafters", "remove", "10.0.0.4:7004", "--server", target], capsys)
    assert (code, out.splitlines()[-1]) == (0, "no drafters in the pool")


def test_cli_errors(target: str, capsys: pytest.CaptureFixture[str]):
    code, out, err = _run_cli(["drafters", "remove", "10.0.0.5:7005", "--server", target], capsys)
    assert (code, out) == (1, "")
    assert err == "error: NOT_FOUND: address: '10.0.0.5:7005' is not in the pool\n"
    code, out, err = _run_cli(["drafters", "add", "no-port", "--server", target, "--json"], capsys)
    assert (code, out) == (1, "")
    assert err == "error: INVALID_ARGUMENT: address: expected HOST:PORT, got 'no-port'\n"
