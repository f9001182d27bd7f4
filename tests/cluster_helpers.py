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


def service_infos(cluster: Cluster, drafters: list[str] | None = None) -> dict[str, engine_pb2.EngineInfo]:
    """GetInfo of the verifier and of `drafters` (default: every drafter the cluster started)."""
    services = [("verifier", cluster.verifier_address, engine_pb2_grpc.VerifierStub)]
    services += [(f"drafter {a}", a, engine_pb2_grpc.DrafterStub)
                 for a in (cluster.drafter_addresses if drafters is None else drafters)]
    return {name: stub_cls(grpc.insecure_channel(address)).GetInfo(engine_pb2.EngineInfoRequest(), timeout=10)
            for name, address, stub_cls in services}


def assert_idle(cluster: Cluster, drafters: list[str] | None = None, timeout_s: float = 20.0) -> None:
    """No request state left and every KV block free on the verifier and `drafters` (default:
    every drafter the cluster started; pass the live ones after a kill), within timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        infos = service_infos(cluster, drafters)
        if all(i.num_requests == 0 and i.free_blocks == i.num_blocks for i in infos.values()):
            return
        assert time.monotonic() < deadline, {n: (i.num_requests, i.free_blocks, i.num_blocks) for n, i in infos.items()}
        time.sleep(0.2)
