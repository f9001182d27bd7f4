"""Fake gateway for the SDK and CLI tests: Generation and DrafterPool in-process, and fixtures.

Test modules load it with ``pytest_plugins = ["fake_servers"]`` so both share one set of
fixtures (`server`, `pool`, `target`, `client`); each module still gets its own server.
They also import its names first, so pytest cannot rewrite its asserts: PYTEST_DONT_REWRITE.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import grpc
import grpc.aio
import pytest

from minedraft import cli
from minedraft.client import Client, DrafterInfo
from minedraft.v1 import generation_pb2, generation_pb2_grpc

SLOW_PROMPT = "slow"
STATS = generation_pb2.AcceptanceStats(num_steps=4, num_drafted=12, num_accepted=9,
                                       mean_acceptance_length=3.25, acceptance_rate=0.75)
FIRST = generation_pb2.DrafterStatus(address="10.0.0.1:7001", drafter_id="0123456789abcdef" * 2,
                                     num_requests=3, reserved_blocks=120, num_blocks=4096,
                                     requests_assigned=2**33)
FIRST_INFO = DrafterInfo(address="10.0.0.1:7001", drafter_id="0123456789abcdef" * 2, num_requests=3,
                         reserved_blocks=120, num_blocks=4096, requests_assigned=2**33)
UNREACHABLE = "10.0.0.9:7009"


def letters(token_ids: list[int]) -> str:
    return "".join(chr(ord("a") + t % 26) for t in token_ids)


class FakeGeneration(generation_pb2_grpc.GenerationServicer):
    """Predictable answers: the output is the prompt's ids reversed, one letter per token.

    Records what it saw per request_id so tests can check what crossed the wire.
    """

    def __init__(self) -> None:
        self.requests: dict[str, generation_pb2.GenerateRequest] = {}
        self.stream_finished: dict[str, threading.Event] = {}
        self.stream_cancelled: dict[str, bool] = {}
        self.stream_sent: dict[str, int] = {}
        self._lock = threading.Lock()
        self._next_id = 0

    def _admit(self, request: generation_pb2.GenerateRequest) -> tuple[str, list[int]] | str:
        """Return (request_id, prompt ids), or an error message for INVALID_ARGUMENT."""
        with self._lock:
            self._next_id += 1
            request_id = request.request_id or f"req-{self._next_id}"
            self.requests[request_id] = request
        if request.sampling.temperature < 0:
            return f"sampling.temperature must be >= 0, got {request.sampling.temperature}"
        if request.prompt == "full":
            return "RESOURCE"
        prompt_ids = list(request.prompt_token_ids) or list(request.prompt.encode())
        return request_id, prompt_ids

    @staticmethod
    def _output(request: generation_pb2.GenerateRequest, prompt_ids: list[int]) -> tuple[list[int], str]:
        limit = request.sampling.max_tokens or 64
        output = prompt_ids[::-1]
        return output[:limit], ("length" if len(output) > limit else "stop")

    async def _reject(self, context: grpc.aio.ServicerContext, message: str) -> None:
        if message == "RESOURCE":
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "queue is full")
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, message)

    async def Generate(self, request, context):
        admitted = self._admit(request)
        if isinstance(admitted, str):
            await self._reject(context, admitted)
        request_id, prompt_ids = admitted
        if request.prompt.startswith(SLOW_PROMPT):
            await asyncio.sleep(5)
        output, finish = self._output(request, prompt_ids)
        return generation_pb2.GenerateResponse(
            request_id=request_id, text=letters(output), token_ids=output, finish_reason=finish,
            stats=STATS, prompt_tokens=len(prompt_ids))

    async def GenerateStream(self, request, context):
        admitted = self._admit(request)
        if isinstance(admitted, str):
            await self._reject(context, admitted)
        request_id, prompt_ids = admitted
        finished = self.stream_finished.setdefault(request_id, threading.Event())
        self.stream_cancelled[request_id] = True  # until the loop runs to the end
        self.stream_sent[request_id] = 0
        output, finish = self._output(request, prompt_ids)
        delay = 0.02 if request.prompt.startswith(SLOW_PROMPT) else 0.0
        try:
            for i, token in enumerate(output):
                if delay:
                    await asyncio.sleep(delay)
                last = i == len(output) - 1
                yield generation_pb2.GenerateStreamResponse(
                    request_id=request_id, text=letters([token]), token_ids=[token],
                    finish_reason=finish if last else "", stats=STATS if last else None,
                    prompt_tokens=len(prompt_ids))
                self.stream_sent[request_id] = i + 1
            self.stream_cancelled[request_id] = False
        finally:
            finished.set()

    async def GetServerInfo(self, request, context):
        return generation_pb2.ServerInfo(version="0.1.0", mode="sd", k=4, target_model="t",
                                         draft_model="d", max_batch=8, num_drafters=2)

    async def GetStepStats(self, request, context):
        count = request.max_steps or 3
        return generation_pb2.StepStats(steps=[
            generation_pb2.StepRecord(step_id=2**40 + i, kind="verify", wall_s=0.5, verify_batch=8)
            for i in range(count)])


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


class ServerThread:
    """Both fakes on one grpc.aio server (as on the gateway), on its own thread and loop.

    Its own event loop lets sync clients block on it.
    """

    def __init__(self) -> None:
        self.generation = FakeGeneration()
        self.pool = FakeDrafterPool()
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._serve(),),
                                        daemon=True)

    async def _serve(self) -> None:
        server = grpc.aio.server()
        generation_pb2_grpc.add_GenerationServicer_to_server(self.generation, server)
        generation_pb2_grpc.add_DrafterPoolServicer_to_server(self.pool, server)
        self.port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        self._stop = asyncio.Event()
        self._ready.set()
        await self._stop.wait()
        await server.stop(None)

    def start(self) -> None:
        self._thread.start()
        assert self._ready.wait(10), "fake server did not start"

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


def rpc_error(code: grpc.StatusCode, details: str) -> grpc.RpcError:
    """An RpcError as a failed call raises it, without a server."""
    class FakeError(grpc.RpcError):
        def code(self) -> grpc.StatusCode:
            return code

        def details(self) -> str:
            return details

    return FakeError()


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """`minedraft ARGV` in this process -> (exit code, stdout, stderr)."""
    code = cli.main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# --------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    thread = ServerThread()
    thread.start()
    yield thread
    thread.stop()


@pytest.fixture
def pool(server: ServerThread) -> FakeDrafterPool:
    """The fake pool, back to its one starting drafter for each test."""
    server.pool.reset()
    return server.pool


@pytest.fixture
def target(server: ServerThread, pool: FakeDrafterPool) -> str:
    return f"127.0.0.1:{server.port}"


@pytest.fixture
def client(target: str) -> Iterator[Client]:
    with Client(target, timeout=10) as c:
        c.wait_ready(5)
        yield c
