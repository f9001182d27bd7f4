"""Overload: an open loop at 1x and 2x the measured capacity, side by side in one run.

    python scripts/overload.py [--seconds 20] [--rounds 2]

Capacity is measured first (closed loop, as many requests in flight as the batches hold).
Then Poisson arrivals at 1x and 2x that rate, interleaved over --rounds: the gateway admits
what its bounded queue holds and refuses the rest at once with RESOURCE_EXHAUSTED. Printed:
requests admitted and refused, the admitted requests' p50/p99 latency (the 2x row should stay
within 2x of the 1x row's p99), and the gateway's resident memory at the start and end of
each run (flat: the refused requests leave nothing behind).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from pathlib import Path

import grpc

from minedraft import bundled
from minedraft.bench.report import percentile
from minedraft.launcher import Cluster, ServeConfig
from minedraft.v1 import generation_pb2, generation_pb2_grpc

MAX_TOKENS = 32


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def one(stub, prompt: str, latencies: list[float], refused: list[int]) -> None:
    start = time.perf_counter()
    request = generation_pb2.GenerateRequest(prompt=prompt, sampling=generation_pb2.SamplingOptions(
        max_tokens=MAX_TOKENS, ignore_eos=True))
    try:
        await stub.Generate(request, timeout=600)
        latencies.append(time.perf_counter() - start)
    except grpc.aio.AioRpcError as err:
        if err.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
            raise
        refused.append(1)


async def closed_loop(address: str, prompts: list[str], concurrency: int) -> float:
    """-> requests per second with `concurrency` always in flight."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = generation_pb2_grpc.GenerationStub(channel)
        queue, latencies = list(prompts), []

        async def worker() -> None:
            while queue:
                await one(stub, queue.pop(), latencies, [])

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return len(prompts) / (time.perf_counter() - start)


async def open_loop(address: str, prompts: list[str], rate: float, seconds: float, seed: int) -> dict:
    rng = random.Random(seed)
    latencies: list[float] = []
    refused: list[int] = []
    async with grpc.aio.insecure_channel(address) as channel:
        stub = generation_pb2_grpc.GenerationStub(channel)
        tasks, end = [], time.perf_counter() + seconds
        while time.perf_counter() < end:
            tasks.append(asyncio.ensure_future(one(stub, rng.choice(prompts), latencies, refused)))
            await asyncio.sleep(rng.expovariate(rate))
        await asyncio.gather(*tasks)
    return {"sent": len(tasks), "admitted": len(latencies), "refused": len(refused),
            "p50": percentile(latencies, 50), "p99": percentile(latencies, 99)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each open-loop run")
    parser.add_argument("--rounds", type=int, default=2, help="1x/2x pairs, interleaved")
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument("--max-waiting", type=int, default=16)
    args = parser.parse_args()
    prompts = bundled.load_prompts()
    config = ServeConfig(mode="psd", k=4, max_batch=args.max_batch, port=0, drafters=1,
                         max_waiting=args.max_waiting)
    with Cluster(config) as cluster:
        gateway_pid = cluster.procs["gateway"].pid
        capacity = asyncio.run(closed_loop(cluster.address, prompts * 2, 2 * args.max_batch))
        print(f"capacity: {capacity:.2f} req/s ({2 * args.max_batch} in flight, {MAX_TOKENS} tokens each); "
              f"queue bound {args.max_waiting}")
        print(f"{'load':>5}{'round':>6}{'sent':>6}{'admitted':>9}{'refused':>8}{'p50 s':>8}{'p99 s':>8}"
              f"{'RSS MB start':>13}{'end':>7}")
        p99 = {1: [], 2: []}
        for round_ in range(args.rounds):
            for load in (1, 2):
                before = rss_mb(gateway_pid)
                row = asyncio.run(open_loop(cluster.address, prompts, load * capacity, args.seconds,
                                            seed=round_ * 10 + load))
                after = rss_mb(gateway_pid)
                p99[load].append(row["p99"])
                print(f"{load:>4}x{round_:>6}{row['sent']:>6}{row['admitted']:>9}{row['refused']:>8}"
                      f"{row['p50']:>8.2f}{row['p99']:>8.2f}{before:>13.1f}{after:>7.1f}", flush=True)
        ratio = statistics.median(p99[2]) / statistics.median(p99[1])
        print(f"admitted p99 at 2x / at 1x (medians over rounds): {ratio:.2f}")


if __name__ == "__main__":
    main()
