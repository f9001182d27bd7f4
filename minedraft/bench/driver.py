"""Drives a workload through the public streaming API and times every request.

Closed loop: `concurrency` workers, each sends its next request when the last finishes.
Open loop: requests arrive at given times (a Poisson process: `--request-rate`, or one whose
rate steps, phases.py), at most `concurrency` in flight as in the closed loop; an arrival
that finds them all busy waits, and its latency and time to first token count from its
arrival, as its user would see them. Streaming gives time to first token, time per output
token and when each token arrived. Every request has the run's length (max_tokens, ignore_eos);
a prompt's own sampling (workload.py) rides on top, so one run can mix greedy and sampled clients.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from itertools import accumulate

from tqdm import tqdm

from minedraft.bench.workload import Sampling
from minedraft.client import AcceptanceSummary, AsyncClient, SamplingOptions
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
    token_s: list[float] = field(default_factory=list)   # when each token arrived (run clock)


def _acceptance(summary: AcceptanceSummary | None) -> AcceptanceStats:
    """The counts the gateway sent with the last chunk; empty when no chunk carried any."""
    if summary is None:
        return AcceptanceStats()
    return AcceptanceStats(summary.num_steps, summary.num_drafted, summary.num_accepted,
                           list(summary.drafted_at), list(summary.accepted_at))


def request_options(max_tokens: int, ignore_eos: bool, sampling: Sampling | None = None) -> SamplingOptions:
    """One request's options: the run's length with the prompt's own sampling, else greedy."""
    return SamplingOptions(max_tokens=max_tokens, ignore_eos=ignore_eos, **(sampling or {}))


def options_for(prompts: list[str], max_tokens: int, ignore_eos: bool,
                sampling: list[Sampling | None] | None) -> list[SamplingOptions]:
    """Each prompt's options (request_options); sampling: each prompt's own, None for greedy."""
    options = [request_options(max_tokens, ignore_eos, own) for own in sampling or [None] * len(prompts)]
    if len(options) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(options)} sampling entries")
    return options


async def _one(client: AsyncClient, prompt: str, options: SamplingOptions, t0: float,
               arrival_s: float | None = None) -> RequestTiming:
    """One streamed request; timed from `arrival_s` (run clock) when given, else from now."""
    start = t0 + arrival_s if arrival_s is not None else time.perf_counter()
    first = None
    tokens: list[int] = []
    token_s: list[float] = []
    stats = None
    async for chunk in client.stream(prompt, options):
        now = time.perf_counter()
        if chunk.token_ids and first is None:
            first = now
        tokens.extend(chunk.token_ids)
        token_s.extend([now - t0] * len(chunk.token_ids))
        stats = chunk.stats or stats
    end = time.perf_counter()
    return RequestTiming(start - t0, (first or end) - start, end - t0, len(tokens), tokens,
                         _acceptance(stats), token_s)


def poisson_times(count: int, rate: float, seed: int = 0) -> list[float]:
    """`count` arrival times of a Poisson process at `rate` per second, the first at 0."""
    rng = random.Random(seed)
    return list(accumulate([0.0] + [rng.expovariate(rate) for _ in range(count - 1)]))[:count]


async def warm_up(address: str, prompts: list[str], max_tokens: int, ignore_eos: bool, concurrency: int,
                  seconds: float, sampling: list[Sampling | None] | None = None) -> int:
    """Serve the prompts in a closed loop at `concurrency`, cycling through them, until `seconds`
    have passed (the requests in flight then run to their end): what a server has done before
    anyone measures it, so a run starts from its steady state (auto mode has measured its
    layouts, the services' allocators and caches are warm). -> requests served."""
    options = options_for(prompts, max_tokens, ignore_eos, sampling)
    served = 0
    async with AsyncClient(address, timeout=3600) as client:
        await client.wait_ready(60)
        deadline = time.perf_counter() + seconds
        bar = tqdm(desc=f"warm-up {seconds:g} s", unit="req", leave=False)

        async def worker() -> None:
            nonlocal served
            while time.perf_counter() < deadline:
                i = served % len(prompts)
                served += 1
                async for _ in client.stream(prompts[i], options[i]):
                    pass
                bar.update(1)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        bar.close()
    return served


async def run_workload(address: str, prompts: list[str], max_tokens: int, ignore_eos: bool,
                       concurrency: int, arrivals: list[float] | None, label: str,
                       sampling: list[Sampling | None] | None = None) -> tuple[list[RequestTiming], float]:
    """arrivals: each prompt's arrival time in s (open loop), None for the closed loop;
    sampling: each prompt's own (Workload.sampling), None for greedy throughout.
    -> per-request timings (in prompt order) and the run's wall time."""
    options = options_for(prompts, max_tokens, ignore_eos, sampling)
    results: list[RequestTiming | None] = [None] * len(prompts)
    bar = tqdm(total=len(prompts), desc=label, unit="req", leave=False)
    async with AsyncClient(address, timeout=3600) as client:
        await client.wait_ready(60)
        t0 = time.perf_counter()

        async def run_index(i: int, arrival_s: float | None = None) -> None:
            results[i] = await _one(client, prompts[i], options[i], t0, arrival_s)
            bar.update(1)

        if arrivals is None:
            queue = list(range(len(prompts)))[::-1]

            async def worker() -> None:
                while queue:
                    await run_index(queue.pop())

            await asyncio.gather(*(worker() for _ in range(concurrency)))
        else:
            limit = asyncio.Semaphore(concurrency)

            async def limited(i: int) -> None:
                async with limit:
                    await run_index(i, arrivals[i])

            tasks = []
            for i, arrival_s in enumerate(arrivals):
                await asyncio.sleep(max(0.0, t0 + arrival_s - time.perf_counter()))
                tasks.append(asyncio.ensure_future(limited(i)))
            await asyncio.gather(*tasks)
        wall = time.perf_counter() - t0
    bar.close()
    return [r for r in results if r is not None], wall
