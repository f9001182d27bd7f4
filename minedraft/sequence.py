"""Per-request generation state and token-level stop conditions. No torch: the gateway uses it."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from minedraft.metrics import AcceptanceStats
from minedraft.sampling_params import SamplingParams


class FinishReason(str, enum.Enum):
    STOP = "stop"        # EOS, a stop token id or a stop string
    LENGTH = "length"    # max_tokens or the model's context limit
    ABORT = "abort"      # cancelled


@dataclass
class Sequence:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    seed: int
    eos_token_ids: tuple[int, ...] = ()
    max_model_len: int | None = None
    output_token_ids: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    stats: AcceptanceStats = field(default_factory=AcceptanceStats)

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def remaining(self) -> int:
        """Tokens this request may still produce."""
        left = self.params.max_tokens - len(self.output_token_ids)
        if self.max_model_len is not None:
            left = min(left, self.max_model_len - self.num_tokens)
        return max(0, left)

    def draft_length(self, k: int) -> int:
        """Drafts worth sending: a step emits up to k + 1 tokens, never more than remaining."""
        return max(0, min(k, self.remaining - 1))

    def append(self, new_token_ids: list[int]) -> list[int]:
        """Append a step's tokens up to the first stop condition; -> the tokens kept."""
        kept: list[int] = []
        stop_ids = set(self.params.stop_token_ids)
        if not self.params.ignore_eos:
            stop_ids.update(self.eos_token_ids)
        for token in new_token_ids:
            if self.is_finished:
                break
            self.output_token_ids.append(token)
            kept.append(token)
            if token in stop_ids:
                self.finish_reason = FinishReason.STOP
            elif self.remaining == 0:
                self.finish_reason = FinishReason.LENGTH
        return kept

    def finish(self, reason: FinishReason) -> None:
        if self.finish_reason is None:
            self.finish_reason = reason
