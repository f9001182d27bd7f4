"""The SDK and the `minedraft generate` command against an in-process fake gateway."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import grpc
import pytest
from fake_servers import SLOW_PROMPT, ServerThread, letters, rpc_error, run_cli

from minedraft.client import (AcceptanceSummary, AsyncClient, Client, GenerationResult,
                              InvalidRequest, MineDraftError, RequestTimeout, ResourceExhausted,
                              SamplingOptions, ServerUnavailable, build_request, error_from_rpc)
from minedraft.metrics import AcceptanceStats

pytest_plugins = ["fake_servers"]  # the fake gateway's fixtures: server, pool, target, client


def _expected(prompt_ids: list[int]) -> tuple[list[int], str]:
    output = prompt_ids[::-1]
    return output, letters(output)


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
    unset = server.generation.requests["no-seed"].sampling
    assert not unset.HasField("seed")
    sampling = server.generation.requests["seed-0"].sampling
    assert sampling.HasField("seed") and sampling.seed == 0
    assert list(sampling.stop) == ["\n\n"] and list(sampling.stop_token_ids) == [2]
    assert (sampling.top_k, sampling.ignore_eos, sampling.max_tokens) == (20, True, 9)
    assert sampling.temperature == pytest.approx(0.7) and sampling.top_p == pytest.approx(0.9)


def test_options_object_with_keyword_overrides(client: Client, server: ServerThread):
    options = SamplingOptions(max_tokens=3, top_k=5, seed=11, stop=["x", "y"])
    client.generate("abcdef", options, request_id="opt-object")
    client.generate("abcdef", options=options, request_id="opt-override", top_k=7, seed=None)
    list(client.stream("abcdef", options, request_id="opt-stream", temperature=0.5))
    sampling = server.generation.requests["opt-object"].sampling
    assert (sampling.max_tokens, sampling.top_k, sampling.seed) == (3, 5, 11)
    assert list(sampling.stop) == ["x", "y"]
    overridden = server.generation.requests["opt-override"].sampling
    assert (overridden.max_tokens, overridden.top_k) == (3, 7)
    assert not overridden.HasField("seed")
    streamed = server.generation.requests["opt-stream"].sampling
    assert (streamed.max_tokens, streamed.seed) == (3, 11)
    assert streamed.temperature == pytest.approx(0.5)
    assert options.top_k == 5  # overrides never change the caller's object
    assert SamplingOptions().to_proto() == build_request("p").sampling


def test_unknown_option_is_a_type_error(client: Client):
    with pytest.raises(TypeError, match="'max_token'"):
        client.generate("hi", max_token=4)
    with pytest.raises(TypeError, match="'temprature'"):
        client.stream("hi", temprature=0.5)
    with pytest.raises(TypeError, match="SamplingOptions, got dict"):
        client.generate("hi", {"max_tokens": 4})
    with pytest.raises(TypeError):
        SamplingOptions(4)  # keyword-only, so positions never silently swap
    with pytest.raises(AttributeError):  # frozen
        SamplingOptions().max_tokens = 1  # type: ignore[misc]


def test_acceptance_summary_uses_the_metrics_definition():
    summary = AcceptanceSummary(num_steps=4, num_drafted=12, num_accepted=9,
                                mean_acceptance_length=3.25, acceptance_rate=0.75,
                                drafted_at=(4, 4, 4), accepted_at=(4, 3, 2))
    stats = summary.to_stats()
    assert isinstance(stats, AcceptanceStats)
    assert (stats.num_steps, stats.num_drafted, stats.num_accepted) == (4, 12, 9)
    assert stats.mean_acceptance_length == summary.mean_acceptance_length
    assert stats.acceptance_rate == summary.acceptance_rate
    assert summary.acceptance_rate_per_position == [1.0, 0.75, 0.5]
    assert summary.drafted_at == (4, 4, 4)  # to_stats copies; the summary stays as it was


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
    assert server.generation.stream_finished[request_id].wait(5), "server stream still running"
    assert server.generation.stream_cancelled[request_id]
    assert server.generation.stream_sent[request_id] < 160


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
            assert server.generation.requests["a-1"].sampling.seed == 7
            short = await c.generate("async", SamplingOptions(max_tokens=2), request_id="a-opt",
                                     seed=3)
            assert short.token_ids == ids[:2] and short.finish_reason == "length"
            assert server.generation.requests["a-opt"].sampling.seed == 3
            with pytest.raises(TypeError, match="'max_token'"):
                await c.generate("x", max_token=2)
            with pytest.raises(TypeError, match="'max_token'"):
                c.stream("x", max_token=2)

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

@pytest.mark.parametrize("stream", [False, True])
def test_cli_generate_json(target: str, capsys: pytest.CaptureFixture[str], stream: bool):
    argv = ["generate", "hello cli", "--server", target, "--max-tokens", "4", "--seed", "3",
            "--stop", "a", "--stop", "b", "--json"] + (["--stream"] if stream else [])
    code, out, _ = run_cli(argv, capsys)
    assert code == 0
    payload: dict[str, Any] = json.loads(out)
    ids, text = _expected(list(b"hello cli")[-4:])
    assert (payload["text"], payload["token_ids"]) == (text, ids)
    assert payload["finish_reason"] == "length" and payload["prompt_tokens"] == 9
    assert payload["request_id"].startswith("req-")
    assert payload["stats"]["num_drafted"] == 12


def test_cli_generate_plain_and_error(target: str, capsys: pytest.CaptureFixture[str]):
    code, out, _ = run_cli(["generate", "abc", "--server", target, "--stream"], capsys)
    assert (code, out) == (0, _expected(list(b"abc"))[1] + "\n")
    code, out, err = run_cli(["generate", "abc", "--server", target, "--temperature", "-1"], capsys)
    assert code == 1 and out == ""
    assert err.startswith("error: INVALID_ARGUMENT: sampling.temperature must be >= 0")
