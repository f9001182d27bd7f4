"""The OpenAI-compatible HTTP front end against real services, with the real `openai` client:
completions and chat, whole and streamed, the same tokens as the gRPC API, refusals in OpenAI's
error body naming the field, 429 on a full queue, API keys, a client that leaves mid-stream;
and the gRPC conventions of the public port (reflection, BadRequest details)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl

import grpc
import httpx2
import openai
import pytest
from google.protobuf.descriptor_pool import DescriptorPool
from google.rpc import error_details_pb2
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase
from grpc_status import rpc_status
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from cluster_helpers import assert_idle, request, stub
from gateway.http.chat_template import ChatTemplate
from gateway.http.server import start_http
from minedraft import bundled
from minedraft.launcher import Cluster, ServeConfig
from minedraft.service.security import API_KEYS_ENV, INTERNAL_TOKEN_ENV, ServerSecurity
from minedraft.v1 import generation_pb2

pytest_plugins = ["security_helpers"]  # its `certs` fixture

PROMPTS = ["def fibonacci(n):", "class Stack:\n    def __init__(self):"]
MAX_TOKENS = 24
MAX_WAITING = 2
API_KEY = "sk-http-test-0123456789"


@pytest.fixture(scope="module")
def cluster():
    """psd, two batches of two: four requests run, MAX_WAITING more may queue."""
    with Cluster(ServeConfig(mode="psd", k=4, max_batch=2, port=0, drafters=1, max_waiting=MAX_WAITING)) as running:
        yield running


@pytest.fixture(scope="module")
def client(cluster) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{cluster.http_url}/v1", api_key="unused", max_retries=0, timeout=120)


def _greedy(client: openai.OpenAI, cluster: Cluster, prompt: str, **extra) -> openai.types.Completion:
    """MAX_TOKENS greedy tokens; `extra`: fields beyond OpenAI's."""
    return client.completions.create(model=cluster.model_name, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                     extra_body={"ignore_eos": True, **extra})


# --------------------------------------------------------------------------- generation

def test_greedy_output_equals_the_grpc_apis(cluster, client):
    grpc_stub = stub(cluster)
    for prompt in PROMPTS:
        expected = grpc_stub.Generate(request(prompt), timeout=120)
        completion = _greedy(client, cluster, prompt)
        assert completion.choices[0].text == expected.text
        assert completion.choices[0].finish_reason == "length"
        assert completion.usage.prompt_tokens == expected.prompt_tokens
        assert completion.usage.completion_tokens == len(expected.token_ids) == MAX_TOKENS
        assert completion.usage.total_tokens == expected.prompt_tokens + MAX_TOKENS
        streamed = client.completions.create(model=cluster.model_name, prompt=prompt, max_tokens=MAX_TOKENS,
                                             temperature=0, stream=True, extra_body={"ignore_eos": True})
        assert "".join(chunk.choices[0].text for chunk in streamed) == expected.text
        # The bundled chat template renders a lone user turn as its text: the same prompt.
        messages = [{"role": "user", "content": prompt}]
        chat = client.chat.completions.create(model=cluster.model_name, messages=messages, temperature=0,
                                              max_completion_tokens=MAX_TOKENS, extra_body={"ignore_eos": True})
        assert chat.choices[0].message.role == "assistant"
        assert chat.choices[0].message.content == expected.text
        chunks = list(client.chat.completions.create(model=cluster.model_name, messages=messages, temperature=0,
                                                     max_tokens=MAX_TOKENS, stream=True,
                                                     extra_body={"ignore_eos": True}))
        assert chunks[0].choices[0].delta.role == "assistant"
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected.text
        assert chunks[-1].choices[0].finish_reason == "length"


def test_seeded_sampling_is_reproducible_and_the_grpc_apis(cluster, client):
    """temperature 0.5 is exact in the gRPC API's float32 too, so both ask for the same."""
    def sampled(seed: int) -> str:
        return client.completions.create(model=cluster.model_name, prompt=PROMPTS[0], max_tokens=MAX_TOKENS,
                                         temperature=0.5, seed=seed, extra_body={"ignore_eos": True}).choices[0].text

    first = sampled(7)
    assert sampled(7) == first
    assert stub(cluster).Generate(request(PROMPTS[0], temperature=0.5, seed=7), timeout=120).text == first
    assert len({sampled(seed) for seed in (1, 2, 3)} | {first}) > 1        # the seed matters


def test_usage_carries_speculation_and_the_speculation_field_controls_it(cluster, client):
    auto = _greedy(client, cluster, PROMPTS[0])
    speculation = auto.usage.speculation
    assert speculation["num_drafted"] > 0 and speculation["num_steps"] > 0
    assert speculation["mean_acceptance_length"] >= 1.0
    assert set(speculation) >= {"num_accepted", "acceptance_rate", "acceptance_rate_per_position"}
    off = _greedy(client, cluster, PROMPTS[0], speculation="off")
    assert off.usage.speculation["num_drafted"] == 0
    assert off.choices[0].text == auto.choices[0].text
    capped = _greedy(client, cluster, PROMPTS[0], speculation=1)
    assert len(capped.usage.speculation["acceptance_rate_per_position"]) <= 1


def test_stream_include_usage_ends_with_a_usage_chunk(cluster, client):
    chunks = list(client.chat.completions.create(
        model=cluster.model_name, messages=[{"role": "user", "content": PROMPTS[1]}], max_tokens=8, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    *deltas, last = chunks
    assert all(chunk.usage is None and len(chunk.choices) == 1 for chunk in deltas)
    assert last.choices == [] and last.usage.completion_tokens == 8
    assert last.usage.speculation["num_steps"] > 0


def test_stop_strings_and_token_id_prompts_as_the_grpc_api(cluster, client):
    grpc_stub = stub(cluster)
    expected = grpc_stub.Generate(request(PROMPTS[0], stop=["\n"], ignore_eos=False), timeout=120)
    stopped = client.completions.create(model=cluster.model_name, prompt=PROMPTS[0], max_tokens=MAX_TOKENS,
                                        temperature=0, stop="\n")
    assert stopped.choices[0].text == expected.text and "\n" not in stopped.choices[0].text
    assert stopped.choices[0].finish_reason == expected.finish_reason
    token_ids = [5, 6, 7, 8]
    expected = grpc_stub.Generate(generation_pb2.GenerateRequest(prompt_token_ids=token_ids, sampling=request(
        "", max_tokens=8).sampling), timeout=120)
    by_ids = client.completions.create(model=cluster.model_name, prompt=token_ids, max_tokens=8, temperature=0,
                                       extra_body={"ignore_eos": True})
    assert by_ids.choices[0].text == expected.text
    assert by_ids.usage.prompt_tokens == len(token_ids) and by_ids.usage.completion_tokens == 8


# --------------------------------------------------------------------------- refusals

BAD_FIELDS = [
    ("completions", {"n": 2}, "n"),
    ("completions", {"temperature": -1}, "temperature"),
    ("completions", {"top_p": 1.5}, "top_p"),
    ("completions", {"max_tokens": 0}, "max_tokens"),
    ("completions", {"seed": -1}, "seed"),
    ("completions", {"stop": 5}, "stop"),
    ("completions", {"logprobs": 2}, "logprobs"),
    ("completions", {"echo": True}, "echo"),
    ("completions", {"presence_penalty": 0.5}, "presence_penalty"),
    ("completions", {"speculation": 99}, "speculation"),
    ("completions", {"speculation": "fast"}, "speculation"),
    ("completions", {"prompt": ""}, "prompt"),
    ("completions", {"prompt": ["a", "b"]}, "prompt"),
    ("completions", {"prompt": [1, 10**6]}, "prompt"),
    ("completions", {"stream": "yes"}, "stream"),
    ("chat/completions", {"max_completion_tokens": -1}, "max_completion_tokens"),
    ("chat/completions", {"logprobs": True}, "logprobs"),
    ("chat/completions", {"messages": []}, "messages"),
    ("chat/completions", {"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
    ("chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages[0].content"),
    ("chat/completions", {"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
]


@pytest.mark.parametrize("endpoint, fields, param", BAD_FIELDS, ids=[f"{e}-{p}" for e, _, p in BAD_FIELDS])
def test_bad_field_is_refused_with_400_naming_it(cluster, endpoint, fields, param):
    body = {"model": cluster.model_name, "max_tokens": 4}
    body.update({"prompt": PROMPTS[0]} if endpoint == "completions" else {"messages": [{"role": "user",
                                                                                        "content": PROMPTS[0]}]})
    body.update(fields)
    response = httpx2.post(f"{cluster.http_url}/v1/{endpoint}", json=body, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param and error["message"].startswith(param), error
    assert error["type"] == "invalid_request_error"


def test_openai_client_sees_the_refusals_typed(cluster, client):
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=cluster.model_name, prompt=PROMPTS[0], n=2)
    assert refused.value.status_code == 400 and refused.value.param == "n"
    with pytest.raises(openai.NotFoundError) as unknown:
        client.completions.create(model="no-such-model", prompt=PROMPTS[0], max_tokens=4)
    assert unknown.value.param == "model"
    response = httpx2.post(f"{cluster.http_url}/v1/completions", content=b"{not json", timeout=60)
    assert response.status_code == 400 and "JSON" in response.json()["error"]["message"]


def test_full_queue_is_429_and_clients_that_leave_free_their_requests(cluster, client):
    """Long streams fill the batches and the queue; the next request is refused with 429.
    Then every stream is dropped mid-way: all their KV comes back."""
    body = {"model": cluster.model_name, "prompt": PROMPTS[0], "max_tokens": 1500, "stream": True,
            "ignore_eos": True}
    with contextlib.ExitStack() as streams:
        http = streams.enter_context(httpx2.Client(timeout=120))
        refused = None
        for _ in range(4 + MAX_WAITING + 4):          # the batches' four, the queue's, then a few more
            response = streams.enter_context(http.stream("POST", f"{cluster.http_url}/v1/completions", json=body))
            if response.status_code != 200:
                refused = response
                break
        assert refused is not None and refused.status_code == 429
        refused.read()
        error = json.loads(refused.content)["error"]
        assert error["type"] == "rate_limit_error" and "queue is full" in error["message"]
        with pytest.raises(openai.RateLimitError):
            client.completions.create(model=cluster.model_name, prompt=PROMPTS[0], max_tokens=4)
    assert_idle(cluster)
    assert _greedy(client, cluster, PROMPTS[0]).usage.completion_tokens == MAX_TOKENS     # serving on


def test_client_that_disconnects_mid_stream_frees_its_request(cluster):
    body = {"model": cluster.model_name, "prompt": PROMPTS[1], "max_tokens": 1500, "stream": True,
            "ignore_eos": True}
    with httpx2.Client(timeout=120) as http:
        with http.stream("POST", f"{cluster.http_url}/v1/completions", json=body) as response:
            assert response.status_code == 200
            events = (line for line in response.iter_lines() if line.startswith("data: "))
            first = [json.loads(next(events)[len("data: "):]) for _ in range(3)]
    assert all(chunk["object"] == "text_completion" for chunk in first)
    assert_idle(cluster)


def test_health_models_and_metrics(cluster):
    # With port 0 the gateway binds the HTTP API on a free port itself and names it: a port
    # picked ahead by the launcher could be taken by another bind before the gateway's (the
    # gateway's own gRPC binds, just before, once took it: uvicorn failed with EADDRINUSE).
    argv = cluster.procs["gateway"].args
    assert argv[argv.index("--http-port") + 1] == "any"
    health = httpx2.get(f"{cluster.http_url}/health", timeout=30)
    assert health.status_code == 200 and health.json() == {"status": "serving"}
    models = httpx2.get(f"{cluster.http_url}/v1/models", timeout=30).json()
    assert [m["id"] for m in models["data"]] == [cluster.model_name]
    metrics = httpx2.get(f"{cluster.http_url}/metrics", timeout=30)
    assert metrics.status_code == 200 and metrics.headers["content-type"].startswith("text/plain")
    assert httpx2.get(f"{cluster.http_url}/v1/nowhere", timeout=30).json()["error"]["code"] == "404"


# --------------------------------------------------------------------------- gRPC conventions

def test_reflection_lists_and_describes_the_public_services(cluster):
    with grpc.insecure_channel(cluster.address) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        services = set(database.get_services())
        assert {"minedraft.v1.Generation", "grpc.health.v1.Health"} <= services
        assert "minedraft.v1.DrafterPool" not in services          # the admin API is not public
        generation = DescriptorPool(database).FindServiceByName("minedraft.v1.Generation")
        assert {"Generate", "GenerateStream", "GetServerInfo"} <= {m.name for m in generation.methods}


@pytest.mark.parametrize("fields, field", [(dict(temperature=-1.0), "sampling.temperature"),
                                           (dict(max_draft=99), "sampling.max_draft")])
def test_bad_field_carries_a_bad_request_detail(cluster, fields, field):
    with pytest.raises(grpc.RpcError) as refused:
        stub(cluster).Generate(request(PROMPTS[0], **fields), timeout=60)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    status = rpc_status.from_call(refused.value)
    assert status.message == refused.value.details() and status.message.startswith(field)
    bad_request = error_details_pb2.BadRequest()
    assert status.details[0].Unpack(bad_request)
    assert [(v.field, v.description) for v in bad_request.field_violations] == [(field, status.message)]


# --------------------------------------------------------------------------- API keys and TLS

@pytest.fixture(scope="module")
def keyed_cluster():
    with pytest.MonkeyPatch.context() as env:
        env.setenv(API_KEYS_ENV, API_KEY)
        env.setenv(INTERNAL_TOKEN_ENV, "http-test-internal-token-0123")
        with Cluster(ServeConfig(mode="ar", max_batch=2, port=0)) as running:
            yield running


def test_api_key_required_when_configured(keyed_cluster):
    url = f"{keyed_cluster.http_url}/v1"
    for key in ("", "sk-wrong-key-wrong"):
        with pytest.raises(openai.AuthenticationError) as refused:
            openai.OpenAI(base_url=url, api_key=key or "none", max_retries=0).completions.create(
                model=keyed_cluster.model_name, prompt=PROMPTS[0], max_tokens=4)
        assert refused.value.status_code == 401 and refused.value.code == "invalid_api_key"
    bare = httpx2.post(f"{url}/completions", json={"prompt": PROMPTS[0]}, timeout=30)
    assert bare.status_code == 401 and "missing API key" in bare.json()["error"]["message"]
    assert httpx2.get(f"{url}/models", timeout=30).status_code == 401
    assert httpx2.get(f"{keyed_cluster.http_url}/health", timeout=30).status_code == 200    # open, as gRPC health
    served = openai.OpenAI(base_url=url, api_key=API_KEY, max_retries=0).completions.create(
        model=keyed_cluster.model_name, prompt=PROMPTS[0], max_tokens=4, extra_body={"ignore_eos": True})
    assert served.usage.completion_tokens == 4


def test_http_serves_the_public_apis_tls_and_mtls(certs):
    async def health(request) -> JSONResponse:
        return JSONResponse({"status": "serving"})

    async def main() -> None:
        app = Starlette(routes=[Route("/health", health)])
        security = ServerSecurity(certs["server_cert"], certs["server_key"], certs["ca"])
        server = await start_http(app, "127.0.0.1", 0, security)
        try:
            assert server.url.startswith("https://")
            trusting = ssl.create_default_context(cafile=certs["ca"])
            async with httpx2.AsyncClient(verify=trusting) as anonymous:
                with pytest.raises(httpx2.TransportError):         # no client certificate: refused
                    await anonymous.get(f"{server.url}/health")
            trusting.load_cert_chain(certs["client_cert"], certs["client_key"])
            async with httpx2.AsyncClient(verify=trusting) as member:
                assert (await member.get(f"{server.url}/health")).status_code == 200
        finally:
            await server.close()

    asyncio.run(main())


def test_bundled_chat_template_renders_system_turns_as_comments():
    template = ChatTemplate.from_model_dir(bundled.TARGET)
    rendered = template.render([{"role": "system", "content": "Helpers.\nFast ones."},
                                {"role": "user", "content": "def add(a, b):"},
                                {"role": "assistant", "content": "\n    return a + b\n"},
                                {"role": "user", "content": "def sub(a, b):"}])
    assert rendered == "# Helpers.\n# Fast ones.\ndef add(a, b):\n    return a + b\ndef sub(a, b):"
