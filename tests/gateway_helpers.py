"""Pieces the in-process Batch Manager tests share: a request as the gateway holds it (no
text: its detokenizer yields nothing) and a channel that closes without a peer."""

from __future__ import annotations

import asyncio

from gateway.request import ActiveRequest
from minedraft.detokenizer import StopStringMatcher
from minedraft.sampling_params import SamplingParams
from minedraft.sequence import Sequence


class SilentDetokenizer:
    def add(self, ids):
        return ""

    def flush(self):
        return ""


def active_request(request_id: str, max_tokens: int) -> ActiveRequest:
    """A running request with a three-token prompt that generates exactly max_tokens."""
    seq = Sequence(request_id, [1, 2, 3], SamplingParams(max_tokens=max_tokens, ignore_eos=True), 0, (), 2048)
    return ActiveRequest(seq, SilentDetokenizer(), StopStringMatcher(()))


class ClosableChannel:
    async def close(self) -> None:
        pass


async def streamed_tokens(req: ActiveRequest, timeout_s: float = 10.0) -> list[int]:
    """Every token the request's events carry, up to its final one (an error fails the test)."""
    tokens = []
    while True:
        event = await asyncio.wait_for(req.events.get(), timeout_s)
        assert event.error is None, event.error
        tokens.extend(event.token_ids)
        if event.finish_reason is not None:
            return tokens
