"""The SDK and the `minedraft generate` command against an in-process fake gateway."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import grpc.aio
import pytest

from minedraft import cli
from minedraft.client import (AsyncClient, Client, GenerationResult, InvalidRequest,
                              MineDraftError, RequestTimeout, ResourceExhausted, ServerUnavailable,
                              error_from_rpc)
from minedraft.v1 import generation_pb2, generation_pb2_grpc

SLOW_PROMPT = "slow"
STATS = generation_pb2.AcceptanceStats(num_steps=4, num_drafted=12, num_accepted=9,
                                       mean_acceptance_length=3.25, acceptance_rate=0.75)


def _letters(token_ids: list[int]) -> str:
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
            request_id=request_id, text=_letters(output), token_ids=output, finish_reason=finish,
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
                    request_id=request_id, text=_letters([token]), token_ids=[token],
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


class ServerThread:
    """A grpc.aio server on its own thread and event loop, so sync clients can block on it."""

    def __init__(self, servicer: Any,
                 add_to_server: Callable[[Any, grpc.aio.Server], None] =
                 generation_pb2_grpc.add_GenerationServicer_to_server) -> None:
        self.servicer = servicer
        self._add_to_server = add_to_server
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._serve(),),
                                        daemon=True)

    async def _serve(self) -> None:
        server = grpc.aio.server()
        self._add_to_server(self.servicer, server)
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


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    thread = ServerThread(FakeGeneration())
    thread.start()
    yield thread
    thread.stop()


@pytest.fixture
def target(server: ServerThread) -> str:
    return f"127.0.0.1:{server.port}"


@pytest.fixture
def client(target: str) -> Iterator[Client]:
    with Client(target, timeout=10) as c:
        c.wait_ready(5)
        yield c


def _expected(prompt_ids: list[int]) -> tuple[list[int], str]:
    output = prompt_ids[::-1]
    return output, _letters(output)


# --------------------------------------------------------------------------- sync client

def test_generate_text_and_token_prompts(client: Client):
    result = client.generate("hello", request_id="r-text")
    ids, text = _expected(list(b"hello"))
    assert isinstance(result, GenerationResult)
    assert (result.request_id, result.text, result.token_ids) == ("r-text", text, ids)
    assert (result.finish_reason, result.prompt_tokens) == ("stop", 5)
    assert result.stats.num_accepted == 9 and result.stats.mean_acceptance_length == 3.25

    result = client.generate([5, 6, 7], max_tokens=2, request_id="r-ids")
    assert result.token_ids == [7, 6] and result.finish_reason == "length"


def test_options_reach_the_server(client: Client, server: ServerThread):
    client.generate("a", request_id="no-seed")
    client.generate("a", request_id="seed-0", seed=0, stop="\n\n", stop_token_ids=[2],
                    temperature=0.7, top_p=0.9, top_k=20, ignore_eos=True, max_tokens=9)
    unset = server.servicer.requests["no-seed"].sampling
    assert not unset.HasField("seed")
    sampling = server.servicer.requests["seed-0"].sampling
    assert sampling.HasField("seed") and sampling.seed == 0
    assert list(sampling.stop) == ["\n\n"] and list(sampling.stop_token_ids) == [2]
    assert (sampling.top_k, sampling.ignore_eos, sampling.max_tokens) == (20, True, 9)
    assert sampling.temperature == pytest.approx(0.7) and sampling.top_p == pytest.approx(0.9)


def test_stream_assembles_to_generate(client: Client):
    whole = client.generate("streaming works")
    chunks = list(client.stream("streaming works", request_id="s-1"))
    assert len(chunks) == len(whole.token_ids)
    assert "".join(c.text for c in chunks) == whole.text
    assert [t for c in chunks for t in c.token_ids] == whole.token_ids
    assert all(c.finish_reason is None and c.stats is None for c in chunks[:-1])
    assert chunks[-1].finish_reason == "stop" and chunks[-1].stats == whole.stats


def test_invalid_argument_carries_server_message(client: Client):
    with pytest.raises(InvalidRequest) as caught:
        client.generate("hi", temperature=-1.0)
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.message.startswith("sampling.temperature must be >= 0")
    with pytest.raises(InvalidRequest, match="sampling.temperature"):
        list(client.stream("hi", temperature=-1.0))
    with pytest.raises(ResourceExhausted, match="queue is full"):
        client.generate("full")


def test_deadline_maps_to_request_timeout(client: Client):
    with pytest.raises(RequestTimeout) as caught:
        client.generate(SLOW_PROMPT, timeout=0.2)
    assert caught.value.code == grpc.StatusCode.DEADLINE_EXCEEDED


def _assert_cancelled(server: ServerThread, request_id: str) -> None:
    assert server.servicer.stream_finished[request_id].wait(5), "server stream still running"
    assert server.servicer.stream_cancelled[request_id]
    assert server.servicer.stream_sent[request_id] < 160


def test_abandoned_stream_is_cancelled(client: Client, server: ServerThread):
    for i, _ in enumerate(client.stream(SLOW_PROMPT * 40, max_tokens=160, request_id="break-sync")):
        if i == 2:
            break
    _assert_cancelled(server, "break-sync")
    # Explicit close, checked while the stream object is still referenced.
    with client.stream(SLOW_PROMPT * 40, max_tokens=160, request_id="close-sync") as stream:
        next(stream)
    _assert_cancelled(server, "close-sync")
    del stream


def test_server_info_and_step_stats(client: Client):
    info = client.server_info()
    assert info["mode"] == "sd" and info["k"] == 4 and info["num_drafters"] == 2
    steps = client.step_stats(max_steps=2)
    assert len(steps) == 2 and steps[0]["step_id"] == 2**40 and steps[0]["kind"] == "verify"


def test_unreachable_server():
    with Client("127.0.0.1:1", timeout=2) as c:
        with pytest.raises(ServerUnavailable):
            c.wait_ready(0.2)
        with pytest.raises(ServerUnavailable):
            c.generate("hi")


def rpc_error(code: grpc.StatusCode, details: str) -> grpc.RpcError:
    """An RpcError as a failed call raises it, without a server."""
    class FakeError(grpc.RpcError):
        def code(self) -> grpc.StatusCode:
            return code

        def details(self) -> str:
            return details

    return FakeError()


def test_unknown_status_maps_to_base_error():
    error = error_from_rpc(rpc_error(grpc.StatusCode.INTERNAL, "boom"))
    assert type(error) is MineDraftError and error.code == grpc.StatusCode.INTERNAL
    assert error.message == "boom"


# --------------------------------------------------------------------------- async client

def test_async_client(target: str, server: ServerThread):
    async def scenario() -> None:
        async with AsyncClient(target, timeout=10) as c:
            await c.wait_ready(5)
            result = await c.generate("async", request_id="a-1", seed=7)
            ids, text = _expected(list(b"async"))
            assert (result.text, result.token_ids, result.finish_reason) == (text, ids, "stop")
            assert server.servicer.requests["a-1"].sampling.seed == 7

            chunks = [chunk async for chunk in c.stream("async", request_id="a-2")]
            assert "".join(ch.text for ch in chunks) == text
            assert [t for ch in chunks for t in ch.token_ids] == ids
            assert chunks[-1].finish_reason == "stop" and chunks[-1].stats == result.stats

            with pytest.raises(InvalidRequest, match="sampling.temperature must be >= 0"):
                await c.generate("x", temperature=-1.0)
            with pytest.raises(InvalidRequest, match="sampling.temperature must be >= 0"):
                [chunk async for chunk in c.stream("x", temperature=-1.0)]
            with pytest.raises(RequestTimeout):
                await c.generate(SLOW_PROMPT, timeout=0.2)

            info = await c.server_info()
            assert info["max_batch"] == 8
            assert len(await c.step_stats()) == 3

    asyncio.run(scenario())


def test_async_abandoned_stream_is_cancelled(target: str, server: ServerThread):
    async def scenario() -> None:
        async with AsyncClient(target, timeout=10) as c:
            count = 0
            async for _ in c.stream(SLOW_PROMPT * 40, max_tokens=160, request_id="break-async"):
                count += 1
                if count == 2:
                    break
            await asyncio.to_thread(_assert_cancelled, server, "break-async")
            # Explicit close, checked while the stream object is still referenced.
            async with c.stream(SLOW_PROMPT * 40, max_tokens=160, request_id="close-async") as stream:
                await stream.__anext__()
            await asyncio.to_thread(_assert_cancelled, server, "close-async")
            del stream

    asyncio.run(scenario())


# --------------------------------------------------------------------------- CLI

def _run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("stream", [False, True])
def test_cli_generate_json(target: str, capsys: pytest.CaptureFixture[str], stream: bool):
    argv = ["generate", "hello cli", "--server", target, "--max-tokens", "4", "--seed", "3",
            "--stop", "a", "--stop", "b", "--json"] + (["--stream"] if stream else [])
    code, out, _ = _run_cli(argv, capsys)
    assert code == 0
    payload: dict[str, Any] = json.loads(out)
    ids, text = _expected(list(b"hello cli")[-4:])
    assert (payload["text"], payload["token_ids"]) == (text, ids)
    assert payload["finish_reason"] == "length" and payload["prompt_tokens"] == 9
    assert payload["request_id"].startswith("req-")
    assert payload["stats"]["num_drafted"] == 12


def test_cli_generate_plain_and_error(target: str, capsys: pytest.CaptureFixture[str]):
    code, out, _ = _run_cli(["generate", "abc", "--server", target, "--stream"], capsys)
    assert (code, out) == (0, _expected(list(b"abc"))[1] + "\n")
    code, out, err = _run_cli(["generate", "abc", "--server", target, "--temperature", "-1"], capsys)
    assert code == 1 and out == ""
    assert err.startswith("error: INVALID_ARGUMENT: sampling.temperature must be >= 0")
