"""The soak test: normal requests, bad inputs, cancels at random moments and one drafter
killed, all at once. It ends with every valid request finished with the reference's greedy
output, every bad one refused with the right status, no request state and all KV free on
every service, and nothing restarted but the killed drafter.

CI runs a short version; MINEDRAFT_SOAK_REQUESTS=2000 runs the issue's cancel storm size
(a third of the requests cancelled), a few minutes here."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time

import grpc

from minedraft import bundled
from cluster_helpers import assert_idle
from minedraft.launcher import Cluster, ServeConfig
from minedraft.v1 import generation_pb2, generation_pb2_grpc
from reference import greedy_reference

NUM_REQUESTS = int(os.environ.get("MINEDRAFT_SOAK_REQUESTS", "240"))
MAX_TOKENS = 8
PROMPTS = bundled.load_prompts(12)
BAD = [(dict(temperature=float("nan")), grpc.StatusCode.INVALID_ARGUMENT),
       (dict(top_p=2.0), grpc.StatusCode.INVALID_ARGUMENT),
       (dict(max_tokens=-5), grpc.StatusCode.INVALID_ARGUMENT)]


async def _one(stub, index: int, rng: random.Random, outcomes: dict) -> None:
    prompt = PROMPTS[index % len(PROMPTS)]
    kind = rng.choice(["normal", "normal", "cancel", "bad"])
    sampling = dict(max_tokens=MAX_TOKENS, ignore_eos=True)
    expected_code = grpc.StatusCode.OK
    if kind == "bad":
        extra, expected_code = BAD[index % len(BAD)]
        sampling.update(extra)
    request = generation_pb2.GenerateRequest(prompt=prompt, sampling=generation_pb2.SamplingOptions(**sampling))
    call = stub.GenerateStream(request, timeout=300)
    tokens: list[int] = []
    try:
        if kind == "cancel":
            cut_after = rng.randint(0, MAX_TOKENS)      # 0: before the first token
            async for chunk in call:
                tokens += chunk.token_ids
                if len(tokens) >= cut_after:
                    break
            call.cancel()
            outcomes["cancelled"] += 1
            return
        async for chunk in call:
            tokens += chunk.token_ids
        outcomes["results"].append((kind, prompt, tokens, grpc.StatusCode.OK, expected_code))
    except grpc.aio.AioRpcError as err:
        outcomes["results"].append((kind, prompt, tokens, err.code(), expected_code))


async def _soak(address: str, kill_drafter) -> dict:
    outcomes = {"results": [], "cancelled": 0}
    rng = random.Random(1234)
    async with grpc.aio.insecure_channel(address) as channel:
        stub = generation_pb2_grpc.GenerationStub(channel)
        limit = asyncio.Semaphore(24)

        async def bounded(index: int) -> None:
            async with limit:
                await _one(stub, index, rng, outcomes)

        tasks = [asyncio.ensure_future(bounded(i)) for i in range(NUM_REQUESTS)]
        await asyncio.sleep(1.0)
        await asyncio.get_running_loop().run_in_executor(None, kill_drafter)
        await asyncio.gather(*tasks)
    return outcomes


def test_soak_normal_bad_cancelled_and_a_drafter_kill():
    _, expected = greedy_reference(PROMPTS, MAX_TOKENS)
    reference = dict(zip(PROMPTS, expected))
    with Cluster(ServeConfig(mode="psd", k=4, max_batch=8, port=0, drafters=2, step_timeout_s=5.0)) as cluster:
        started = time.monotonic()
        outcomes = asyncio.run(_soak(cluster.address, lambda: cluster.kill("drafter-1")))
        elapsed = time.monotonic() - started
        results = outcomes["results"]
        print(f"soak: {NUM_REQUESTS} requests in {elapsed:.1f} s: {outcomes['cancelled']} cancelled, "
              f"{sum(k == 'bad' for k, *_ in results)} bad, {sum(k == 'normal' for k, *_ in results)} normal")
        wrong_status = [(k, code, want) for k, _, _, code, want in results if code != want]
        assert wrong_status == []
        # Greedy and served: a rare near-tie may flip a token (tests/reference.py); allow one.
        diverged = [p for k, p, tokens, *_ in results if k == "normal" and tokens != reference[p]]
        assert len(diverged) <= 1, diverged
        assert outcomes["cancelled"] > NUM_REQUESTS // 8
        assert_idle(cluster, drafters=[cluster.drafter_addresses[0]], timeout_s=30)
        assert cluster.dead() == []                      # nothing died but the killed drafter
        assert cluster.procs["drafter-1"].returncode == -signal.SIGKILL
