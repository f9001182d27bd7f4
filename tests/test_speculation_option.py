"""Per-request speculation (`auto`, `off`, or at most N draft tokens a step): the SDK's and the
CLI's mapping onto sampling.max_draft, the gateway's check against its k and the ActiveRequest
it builds, and the effect on a real psd cluster."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import grpc
import pytest
from fake_servers import ServerThread, run_cli

from gateway.frontend import Frontend
from gateway.servicer import GenerationServicer, server_info
from gateway.tokenizer import TextTokenizer
from minedraft import bundled
from minedraft.client import AsyncClient, Client, InvalidRequest, SamplingOptions, build_request
from minedraft.launcher import Cluster, ServeConfig
from minedraft.v1 import generation_pb2, generation_pb2_grpc

pytest_plugins = ["fake_servers"]  # the fake gateway's fixtures: server, pool, target, client

K = 4
# (SDK value, the max_draft the wire carries; None = unset)
MAPPINGS = [("auto", None), ("off", 0), (0, 0), (3, 3), (K, K)]
BAD_VALUES = ["fast", "AUTO", "", -1, True, False, 2.5, None, [1], 2**32]


# --------------------------------------------------------------------------- SDK

@pytest.mark.parametrize("speculation, max_draft", MAPPINGS)
def test_sdk_maps_speculation_to_max_draft(speculation, max_draft):
    sampling = build_request("p", speculation=speculation).sampling
    assert sampling.HasField("max_draft") == (max_draft is not None)
    assert sampling.max_draft == (max_draft or 0)
    assert SamplingOptions(speculation=speculation).to_proto() == sampling


def test_speculation_defaults_to_auto():
    assert SamplingOptions().speculation == "auto"
    assert not build_request("p").sampling.HasField("max_draft")


@pytest.mark.parametrize("bad", BAD_VALUES, ids=repr)
def test_sdk_refuses_bad_speculation(bad, client: Client, server: ServerThread):
    with pytest.raises(ValueError, match="^speculation must be"):
        SamplingOptions(speculation=bad)
    with pytest.raises(ValueError, match="^speculation must be"):
        SamplingOptions().replace(speculation=bad)
    with pytest.raises(ValueError, match="^speculation must be"):
        client.generate("hi", request_id="bad-generate", speculation=bad)
    with pytest.raises(ValueError, match="^speculation must be"):
        client.stream("hi", request_id="bad-stream", speculation=bad)
    assert not {"bad-generate", "bad-stream"} & server.generation.requests.keys()  # nothing was sent


def test_sync_client_sends_speculation(client: Client, server: ServerThread):
    for speculation, max_draft in MAPPINGS:
        client.generate("abc", request_id=f"gen-{speculation}", speculation=speculation)
        list(client.stream("abc", SamplingOptions(speculation=speculation), request_id=f"stream-{speculation}"))
        for request_id in (f"gen-{speculation}", f"stream-{speculation}"):
            sampling = server.generation.requests[request_id].sampling
            assert (sampling.max_draft if sampling.HasField("max_draft") else None) == max_draft, request_id


def test_async_client_sends_speculation_and_refuses_bad_values(target: str, server: ServerThread):
    async def scenario() -> None:
        async with AsyncClient(target, timeout=10) as c:
            await c.generate("abc", request_id="a-off", speculation="off")
            [chunk async for chunk in c.stream("abc", request_id="a-two", speculation=2)]
            with pytest.raises(ValueError, match="^speculation must be"):
                await c.generate("abc", request_id="a-bad", speculation="fast")
            with pytest.raises(ValueError, match="^speculation must be"):
                c.stream("abc", request_id="a-bad", speculation=-1)

    asyncio.run(scenario())
    assert server.generation.requests["a-off"].sampling.max_draft == 0
    assert server.generation.requests["a-two"].sampling.max_draft == 2
    assert "a-bad" not in server.generation.requests


# --------------------------------------------------------------------------- CLI

@pytest.mark.parametrize("flag, max_draft", [([], None), (["--speculation", "auto"], None),
                                             (["--speculation", "off"], 0), (["--speculation", "3"], 3)])
def test_cli_speculation_reaches_the_server(flag, max_draft, target: str, server: ServerThread,
                                            capsys: pytest.CaptureFixture[str]):
    code, out, _ = run_cli(["generate", "abc", "--server", target, "--json", *flag], capsys)
    assert code == 0
    sampling = server.generation.requests[json.loads(out)["request_id"]].sampling
    assert (sampling.max_draft if sampling.HasField("max_draft") else None) == max_draft


@pytest.mark.parametrize("value", ["fast", "-1", "2.5", "+2", "", str(2**32)])
def test_cli_refuses_bad_speculation(value: str, capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as exited:
        run_cli(["generate", "abc", "--speculation", value], capsys)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "argument --speculation: speculation must be 'auto', 'off' or a draft length N" in err
    assert value in err


# --------------------------------------------------------------------------- gateway, in-process

class Refused(Exception):
    """What the fake context's abort raises, as grpc.aio's does, so _build stops there."""


class AbortingContext:
    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise Refused(code, details)

    async def abort_with_status(self, status: grpc.Status) -> None:
        raise Refused(status.code, status.details)


def _servicer(mode: str = "psd", k: int = K) -> GenerationServicer:
    """The servicer over a manager that admits everything: only the request building runs."""
    manager = SimpleNamespace(unavailable="", admission=SimpleNamespace(fits_ever=lambda req: True))
    frontend = Frontend(manager, TextTokenizer(bundled.TARGET), vocab_size=100, eos_token_ids=(0,),
                        max_model_len=64, k=k)
    return GenerationServicer(frontend, info=server_info(mode, k, 4, "target", 0.0))


def _build(servicer: GenerationServicer, **sampling):
    request = generation_pb2.GenerateRequest(prompt_token_ids=[1, 2, 3],
                                             sampling=generation_pb2.SamplingOptions(**sampling))
    return asyncio.run(servicer._build(request, AbortingContext()))


@pytest.mark.parametrize("max_draft", [None, 0, 1, K])
def test_servicer_puts_max_draft_on_the_request(max_draft):
    sampling = {} if max_draft is None else {"max_draft": max_draft}
    req = _build(_servicer(), **sampling)
    assert req.max_draft == max_draft


@pytest.mark.parametrize("mode, k, max_draft", [("psd", K, K + 1), ("psd", K, 2**32 - 1), ("ar", 0, 1)])
def test_servicer_refuses_max_draft_beyond_k(mode, k, max_draft):
    with pytest.raises(Refused) as refused:
        _build(_servicer(mode, k), max_draft=max_draft)
    code, details = refused.value.args
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details == f"sampling.max_draft: {max_draft} is more than this server's longest draft (k = {k})"


def test_ar_server_accepts_speculation_off():
    assert _build(_servicer("ar", 0), max_draft=0).max_draft == 0


# --------------------------------------------------------------------------- a real cluster

@pytest.fixture(scope="module")
def cluster():
    with Cluster(ServeConfig(mode="psd", k=K, max_batch=4, port=0, drafters=1)) as running:
        yield running


@pytest.fixture(scope="module")
def real_client(cluster):
    with Client(cluster.address, timeout=120) as c:
        yield c


def test_gateway_refuses_max_draft_beyond_k_and_keeps_serving(cluster, real_client: Client):
    stub = generation_pb2_grpc.GenerationStub(grpc.insecure_channel(cluster.address))
    with pytest.raises(grpc.RpcError) as refused:
        stub.Generate(generation_pb2.GenerateRequest(
            prompt="def add(a, b):", sampling=generation_pb2.SamplingOptions(max_draft=K + 1)), timeout=60)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details().startswith(f"sampling.max_draft: {K + 1} is more than")
    with pytest.raises(InvalidRequest) as sdk_refused:
        real_client.generate("def add(a, b):", speculation=9)
    assert sdk_refused.value.message.startswith("sampling.max_draft: 9 is more than")
    assert len(real_client.generate("def add(a, b):", max_tokens=8, ignore_eos=True).token_ids) == 8


def test_speculation_off_and_capped_keep_the_greedy_output(real_client: Client):
    """Greedy output is the target's whatever is drafted; `off` drafts nothing and 1 never
    drafts past the first position (drafted_at[j] counts steps that drafted position j)."""
    options = SamplingOptions(max_tokens=24, ignore_eos=True)
    auto = real_client.generate("def fibonacci(n):", options)
    off = real_client.generate("def fibonacci(n):", options, speculation="off")
    capped = real_client.generate("def fibonacci(n):", options, speculation=1)
    assert auto.stats.num_drafted > 0                      # psd drafts when the client leaves it
    assert off.stats.num_drafted == 0 and off.stats.drafted_at == ()
    assert off.token_ids == auto.token_ids
    assert 0 < capped.stats.num_drafted and len(capped.stats.drafted_at) <= 1
    assert capped.token_ids == auto.token_ids
