"""What the service tests share: requests, the reference check, KV accounting."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import grpc

from minedraft import bundled
from minedraft.launcher import Cluster
from minedraft.llm import LLM
from minedraft.sampling_params import SamplingParams
from minedraft.v1 import (
    engine_pb2,
    engine_pb2_grpc,
    generation_pb2,
    generation_pb2_grpc,
)

TARGET = os.environ.get("MINEDRAFT_TEST_TARGET", bundled.TARGET)
DRAFT = os.environ.get("MINEDRAFT_TEST_DRAFT", bundled.DRAFT)
MAX_TOKENS = 24
NEAR_TIE = 1e-5


def greedy_reference(prompts: list[str], max_tokens: int) -> tuple[LLM, list[list[int]]]:
    """The in-process target's plain greedy output: what every served mode must reproduce."""
    llm = LLM(TARGET, dtype="float32")
    outputs = llm.generate(prompts, SamplingParams(max_tokens=max_tokens, ignore_eos=True), mode="ar", max_batch=8)
    return llm, [o.token_ids for o in outputs]


def stub(cluster: Cluster):
    return generation_pb2_grpc.GenerationStub(grpc.insecure_channel(cluster.address))


def request(prompt: str, **sampling) -> generation_pb2.GenerateRequest:
    sampling.setdefault("max_tokens", MAX_TOKENS)
    sampling.setdefault("ignore_eos", True)
    return generation_pb2.GenerateRequest(prompt=prompt, sampling=generation_pb2.SamplingOptions(**sampling))


def generate_all(cluster: Cluster, requests, concurrency: int = 8):
    channel_stub = stub(cluster)
    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(lambda r: channel_stub.Generate(r, timeout=300), requests))


def is_near_tie(llm: LLM, prompt: str, expected: list[int], got: list[int]) -> bool:
    from minedraft.model_runner import ForwardChunk

    first = next(i for i, (a, b) in enumerate(zip(expected, got)) if a != b)
    runner = llm.verifier.runner
    logits = runner.forward([ForwardChunk("tie", llm.tokenizer.encode(prompt) + expected[:first])])[0]
    runner.free("tie")
    top2 = logits.topk(2).values
    return float(top2[0] - top2[1]) < NEAR_TIE


def free_blocks(cluster: Cluster, dead_drafters: tuple[str, ...] = ()) -> dict[str, tuple[int, int]]:
    counts = {}
    services = [("verifier", cluster.verifier_address, engine_pb2_grpc.VerifierStub)]
    services += [(f"drafter {a}", a, engine_pb2_grpc.DrafterStub) for a in cluster.drafter_addresses
                 if a not in dead_drafters]
    for name, address, stub_cls in services:
        if address:
            info = stub_cls(grpc.insecure_channel(address)).GetInfo(engine_pb2.EngineInfoRequest(), timeout=10)
            counts[name] = (info.free_blocks, info.num_blocks)
    return counts


def assert_blocks_returned(cluster: Cluster, dead_drafters: tuple[str, ...] = ()) -> None:
    """Every live service's KV blocks are back at their free count."""
    deadline = time.monotonic() + 10
    while True:
        counts = free_blocks(cluster, dead_drafters)
        if all(free == total for free, total in counts.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert all(free == total for free, total in counts.values()), counts
