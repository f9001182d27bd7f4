"""Per-request sampling settings, validated once when a request is admitted."""

from __future__ import annotations

import math
from dataclasses import dataclass

_MAX_SEED = 2**63
# Below this a temperature divides logits into overflow (1e-38 gave NaN probabilities):
# such requests sample greedily, which is what the temperature asks for in the limit.
GREEDY_BELOW_TEMPERATURE = 1e-5
MAX_STOP_STRINGS = 16
MAX_STOP_LENGTH = 256       # characters; each step scans the new text for every stop string


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples its tokens.

    Frozen so the Batch Manager, the runner and the sampler all see the same settings for
    the life of a request; a change means a new request.
    """

    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0  # 1 = off
    top_k: int = 0  # 0 = off
    max_tokens: int = 64
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()  # stop strings, matched on the detokenized text
    ignore_eos: bool = False
    seed: int | None = None  # None = the engine picks one; fixed = reproducible output

    def __post_init__(self) -> None:
        # Callers (JSON, protobuf) hand us lists; tuples keep the dataclass hashable
        # and truly immutable.
        if isinstance(self.stop_token_ids, list):
            object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        if isinstance(self.stop, list):
            object.__setattr__(self, "stop", tuple(self.stop))
        self.validate()
        if 0 < self.temperature < GREEDY_BELOW_TEMPERATURE:
            object.__setattr__(self, "temperature", 0.0)

    def validate(self) -> None:
        """Reject bad user input with a message that names the field."""
        if not _is_real(self.temperature) or not math.isfinite(self.temperature):
            raise ValueError(f"temperature must be a finite number, got {self.temperature!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        if not _is_real(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not _is_int(self.top_k) or self.top_k < 0:
            raise ValueError(f"top_k must be an int >= 0 (0 = off), got {self.top_k!r}")
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an int >= 1, got {self.max_tokens!r}")
        if self.seed is not None and (not _is_int(self.seed) or not 0 <= self.seed < _MAX_SEED):
            raise ValueError(f"seed must be an int in [0, 2**63), got {self.seed!r}")
        if not isinstance(self.stop_token_ids, tuple):
            raise ValueError(
                f"stop_token_ids must be a tuple or list of ints, got {self.stop_token_ids!r}"
            )
        for token_id in self.stop_token_ids:
            if not _is_int(token_id) or token_id < 0:
                raise ValueError(
                    f"stop_token_ids must hold ints >= 0, got {token_id!r} "
                    f"in {self.stop_token_ids!r}"
                )
        if not isinstance(self.stop, tuple):
            raise ValueError(f"stop must be a tuple or list of strings, got {self.stop!r}")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise ValueError(f"stop: {len(self.stop)} stop strings; at most {MAX_STOP_STRINGS}")
        for stop_string in self.stop:
            if not isinstance(stop_string, str) or not stop_string:
                raise ValueError(f"stop must hold non-empty strings, got {stop_string!r}")
            if len(stop_string) > MAX_STOP_LENGTH:
                raise ValueError(f"stop: a stop string of {len(stop_string)} characters; "
                                 f"at most {MAX_STOP_LENGTH}")
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be a bool, got {self.ignore_eos!r}")

    @property
    def is_greedy(self) -> bool:
        """Greedy requests take the argmax and need no random noise."""
        return self.temperature == 0


def _is_int(value: object) -> bool:
    # bool is an int subclass, but top_k=True is a bug, not a setting.
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
