"""Drives a workload through the public streaming API and times every request.

Closed loop: `concurrency` workers, each sends its next request when the last finishes.
Open loop: requests arrive as a Poisson process at `request_rate` per second, whatever
is in flight. Streaming gives time to first token and time per output token.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass

from tqdm import tqdm

from minedraft.client import AcceptanceSummary, AsyncClient
from minedraft.metrics import AcceptanceStats


@dataclass
class RequestTiming:
    start_s: float
    ttft_s: float
    end_s: float
    output_tokens: int
    token_ids: list[int]
    # Kept as the one definition's counts, so a run's figures come from merging them.
    acceptance: AcceptanceStats


def _acceptance(summary: AcceptanceSummary | None) -> AcceptanceStats:
    """The counts the gateway sent with the last chunk; empty when no chunk carried any."""
    if summary is None:
        return AcceptanceStats()
    return AcceptanceStats(summary.num_steps, summary.num_drafted, summary.num_accepted,
                           list(summary.drafted_at), list(summary.accepted_at))


async def _one(client: AsyncClient, prompt: str, max_tokens: int, ignore_eos: bool, t0: float) -> RequestTiming:
    start = time.perf_counter()
    first = None
    tokens: list[int] = []
    stats = None
    async for chunk in client.stream(prompt, max_tokens=max_tokens, ignore_eos=ignore_eos):
        if chunk.token_ids and first is None:
            first = time.perf_counter()
        tokens.extend(chunk.token_ids)
        stats = chunk.stats or stats
    end = time.perf_counter()
    return RequestTiming(start - t0, (first or end) - start, end - t0, len(tokens), tokens,
                         _acceptance(stats))


async def run_workload(address: str, prompts: list[str], max_tokens: int, ignore_eos: bool,
                       concurrency: int, request_rate: float | None, label: str,
                       seed: int = 0) -> tuple[list[RequestTiming], float]:
    """-> per-request timings (in prompt order) and the run's wall time."""
    results: list[RequestTiming | None] = [None] * len(prompts)
    bar = tqdm(total=len(prompts), desc=label, unit="req", leave=False)
    async with AsyncClient(address, timeout=3600) as client:
        await client.wait_ready(60)
        t0 = time.perf_counter()

        async def run_index(i: int) -> None:
            results[i] = await _one(client, prompts[i], max_tokens, ignore_eos, t0)
            bar.update(1)

        if request_rate is None:
            queue = list(range(len(prompts)))[::-1]

            async def worker() -> None:
                while queue:
                    await run_index(queue.pop())

            await asyncio.gather(*(worker() for _ in range(concurrency)))
        else:
            rng = random.Random(seed)
            limit = asyncio.Semaphore(concurrency)

            async def limited(i: int) -> None:
                async with limit:
                    await run_index(i)

            tasks = []
            for i in range(len(prompts)):
                tasks.append(asyncio.ensure_future(limited(i)))
                await asyncio.sleep(rng.expovariate(request_rate))
            await asyncio.gather(*tasks)
        wall = time.perf_counter() - t0
    bar.close()
    return [r for r in results if r is not None], wall
