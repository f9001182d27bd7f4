"""A request as the gateway sees it: token state, text state, and the client's event queue."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gateway.metrics import METRICS
from minedraft.detokenizer import IncrementalDetokenizer, StopStringMatcher
from minedraft.sequence import FinishReason, Sequence

if TYPE_CHECKING:
    from gateway.pool import DrafterHandle

logger = logging.getLogger("minedraft.gateway")


@dataclass
class StreamEvent:
    token_ids: list[int]
    text: str
    finish_reason: str | None = None
    error: tuple[object, str] | None = None       # (grpc.StatusCode, message)


@dataclass(eq=False)
class ActiveRequest:
    seq: Sequence
    detokenizer: IncrementalDetokenizer
    stop_matcher: StopStringMatcher
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    known_to_verifier: bool = False
    drafter: DrafterHandle | None = None                     # where its draft KV lives
    known_to_drafter: bool = False                           # that drafter has it (prefilled)
    pending_diff: list[int] = field(default_factory=list)   # verified tokens the drafter has not heard
    cancelled: bool = False
    done: bool = False                                       # final event sent
    client_id: str = ""                                      # the id the client knows it by
    max_draft: int | None = None                             # draft tokens a step at most; None = auto, 0 = off
    draft_reach: tuple[float, ...] = ()                      # auto: the acceptance its latest k was chosen by
    # For latency metrics and the finished-request log line (time.monotonic()).
    arrival_s: float = field(default_factory=time.monotonic)  # built: checked and tokenised
    first_token_s: float | None = None
    last_token_s: float = 0.0

    @property
    def request_id(self) -> str:
        return self.seq.request_id

    @property
    def drafter_catch_up(self) -> int:
        """Tokens its drafter has yet to take in before drafting for it: those verified since
        it last heard, or all of them when it never has."""
        return len(self.pending_diff) if self.known_to_drafter else len(self.seq.token_ids)

    def draft_cap(self, k: int) -> int:
        """The longest draft a step may give it under a cap of k: k, or its own max_draft
        where that is lower (not yet its end: Sequence.draft_length)."""
        return k if self.max_draft is None else min(k, self.max_draft)

    @property
    def live(self) -> bool:
        return not (self.done or self.cancelled or self.seq.is_finished)

    def emit_tokens(self, tokens: list[int]) -> None:
        """Turn one step's kept tokens into a text delta, applying stop strings."""
        stop_ids = set(self.seq.params.stop_token_ids)
        if not self.seq.params.ignore_eos:
            stop_ids.update(self.seq.eos_token_ids)
        text_ids = tokens
        if self.seq.finish_reason == FinishReason.STOP and tokens and tokens[-1] in stop_ids:
            text_ids = tokens[:-1]
        text, stopped = self.stop_matcher.feed(self.detokenizer.add(text_ids))
        if stopped:
            self.seq.finish(FinishReason.STOP)
        if tokens:
            METRICS.tokens_emitted(self, len(tokens))
        if tokens or text:
            self.events.put_nowait(StreamEvent(tokens, text))

    def emit_final(self, reason: FinishReason) -> None:
        if self.done:
            return
        self.seq.finish(reason)
        tail = ""
        if not self.stop_matcher.stopped and reason != FinishReason.ABORT:
            tail, stopped = self.stop_matcher.feed(self.detokenizer.flush())
            if not stopped:
                tail += self.stop_matcher.flush()
        self.events.put_nowait(StreamEvent([], tail, finish_reason=self.seq.finish_reason.value))
        self.done = True
        METRICS.request_finished(self)
        self._log_end(self.seq.finish_reason.value)

    def emit_error(self, code: object, message: str) -> None:
        if not self.done:
            self.seq.finish(FinishReason.ABORT)
            self.events.put_nowait(StreamEvent([], "", error=(code, message)))
            self.done = True
            code_name = getattr(code, "name", str(code))
            METRICS.request_failed(code_name)
            self._log_end(f"error {code_name}")

    def _log_end(self, how: str) -> None:
        """One line per request, its figures also as fields for --log-format json."""
        if not logger.isEnabledFor(logging.INFO):
            return
        stats, now = self.seq.stats, time.monotonic()
        fields = {"request_id": self.request_id, "prompt_tokens": len(self.seq.prompt_token_ids),
                  "generated_tokens": len(self.seq.output_token_ids), "finish_reason": how,
                  "mean_acceptance_length": round(stats.mean_acceptance_length if stats.num_steps else 1.0, 3),
                  "acceptance_rate": round(stats.acceptance_rate, 3),
                  "ttft_s": None if self.first_token_s is None else round(self.first_token_s - self.arrival_s, 4),
                  "total_s": round(now - self.arrival_s, 4)}
        logger.info("request %(request_id)s %(finish_reason)s: %(prompt_tokens)d prompt + %(generated_tokens)d "
                    "generated tokens, acceptance length %(mean_acceptance_length).2f (rate %(acceptance_rate).2f), "
                    "TTFT %(ttft_s)s s, total %(total_s).3f s", fields, extra=fields)
