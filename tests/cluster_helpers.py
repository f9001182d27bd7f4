"""What the service tests share: stubs, requests sent side by side, KV accounting.

The greedy reference they check outputs against is in `reference.py`, with the in-process tests'."""

from __future__ import annotations

import time

import grpc

from concurrency import run_concurrently
from minedraft.launcher import Cluster
from minedraft.v1 import engine_pb2, engine_pb2_grpc, generation_pb2, generation_pb2_grpc

MAX_TOKENS = 24


def stub(cluster: Cluster) -> generation_pb2_grpc.GenerationStub:
    return generation_pb2_grpc.GenerationStub(grpc.insecure_channel(cluster.address))


def request(prompt: str, **sampling) -> generation_pb2.GenerateRequest:
    sampling.setdefault("max_tokens", MAX_TOKENS)
    sampling.setdefault("ignore_eos", True)
    return generation_pb2.GenerateRequest(prompt=prompt, sampling=generation_pb2.SamplingOptions(**sampling))


def generate_all(cluster: Cluster, requests: list[generation_pb2.GenerateRequest],
                 concurrency: int = 8) -> list[generation_pb2.GenerateResponse]:
    """Unary Generate calls, `concurrency` at a time; -> the responses in request order."""
    channel_stub = stub(cluster)
    return run_concurrently([lambda r=r: channel_stub.Generate(r, timeout=300) for r in requests], concurrency)


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
