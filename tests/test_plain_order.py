"""Plain decoding keeps two steps of a batch in flight, and gRPC does not order the answers
of concurrent calls: the later step's answer may come back first. Each step's tokens must
still reach the request, and its stream, in step order.

The bug this guards: a bench run's plain decoding once streamed two adjacent tokens swapped
(`[1232, 282]` where the target gives `[282, 1232]`), every later token right: the answer of
the step queued behind another was applied before that step's own."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from gateway_helpers import active_request, streamed_tokens

from gateway.batch_manager import BatchManager, BatchManagerConfig
from minedraft.v1 import engine_pb2


class OvertakingVerifier:
    """Runs steps in their queue order (after_step_id, as the real verifier does) and gives
    each request its next token, numbered; every other step answers late, so the step
    queued behind it answers first."""

    def __init__(self) -> None:
        self.applied: set[int] = set()
        self.given: Counter[str] = Counter()
        self.steps = 0

    async def Step(self, request, timeout=None):
        while request.after_step_id and request.after_step_id not in self.applied:
            await asyncio.sleep(0)
        self.applied.add(request.step_id)
        self.steps += 1
        results = []
        for item in request.items:
            if not item.drop:
                results.append(engine_pb2.VerifyResult(request_id=item.request_id, num_draft=0,
                                                       token_ids=[100 + self.given[item.request_id]]))
                self.given[item.request_id] += 1
        if self.steps % 2:
            await asyncio.sleep(0.02)
        return engine_pb2.VerifyStepResponse(step_id=request.step_id, busy_s=0.001, results=results)


@pytest.mark.parametrize("requests", [1, 3])
def test_plain_steps_answered_out_of_order_stream_their_tokens_in_order(requests):
    async def scenario() -> list[list[int]]:
        verifier = OvertakingVerifier()
        manager = BatchManager(BatchManagerConfig(mode="ar", k=0, max_batch=4, kv_blocks=10_000, block_size=16,
                                                  step_timeout_s=5.0), verifier, None)
        runner = asyncio.ensure_future(manager.run())
        reqs = [active_request(f"r{i}", max_tokens=12) for i in range(requests)]
        for req in reqs:
            manager.submit(req)
        try:
            return await asyncio.gather(*(streamed_tokens(req) for req in reqs))
        finally:
            runner.cancel()

    for tokens in asyncio.run(scenario()):
        assert tokens == list(range(100, 112))
