"""Streaming text from token ids: incremental detokenisation and stop strings.

Detokenisation is `tokenizers`' DecodeStream over a `tokenizers.Tokenizer` (no torch, no
transformers), so the gateway can use it as it is.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

# How many prompt tokens give the first output token its left context. Tokenizers that
# strip a leading space at the start of a decode (sentencepiece) need at least one.
_PROMPT_CONTEXT_TOKENS = 5
_REPLACEMENT_CHAR = "\ufffd"


def backend_tokenizer(tokenizer: object) -> Tokenizer:
    """The `tokenizers.Tokenizer` behind `tokenizer`: itself, or its `backend_tokenizer`
    (what transformers' fast tokenizers and the gateway's TextTokenizer expose)."""
    backend = tokenizer if isinstance(tokenizer, Tokenizer) else getattr(tokenizer, "backend_tokenizer", None)
    if not isinstance(backend, Tokenizer):
        raise TypeError(f"incremental detokenisation needs a tokenizers.Tokenizer or an object with a "
                        f"`backend_tokenizer` one, got {type(tokenizer).__name__}")
    return backend


class IncrementalDetokenizer:
    """Turns a growing list of output token ids into text deltas, one call per step.

    DecodeStream decodes only a short window (the last emitted chunk as left context, then
    the new ids) and holds a UTF-8 character that byte-level BPE split over several tokens
    until a later token completes it. Two things are left to this class: the prompt's last
    tokens as the first window's context (dropped when the prompt ends inside a character,
    whose tail would otherwise merge with the output's first bytes), and `flush`, since the
    stream keeps an incomplete tail to itself; so the ids it has not yet turned into text
    are tracked here too, with complete text to their left.
    """

    def __init__(self, tokenizer: object, prompt_token_ids: Sequence[int],
                 skip_special_tokens: bool = True) -> None:
        self._tokenizer = backend_tokenizer(tokenizer)
        self._skip_special_tokens = skip_special_tokens
        context = list(prompt_token_ids[-_PROMPT_CONTEXT_TOKENS:])
        if self._decode(context).endswith(_REPLACEMENT_CHAR):
            context = []
        self._start(context)

    def _start(self, context: list[int]) -> None:
        self._stream = DecodeStream(context, skip_special_tokens=self._skip_special_tokens)
        self._context = context             # ids whose text was emitted (or is the prompt's)
        self._held: list[int] = []          # ids fed since the stream last gave text

    def add(self, new_token_ids: Sequence[int]) -> str:
        """Append output tokens; return the text they complete (may be empty)."""
        if not new_token_ids:
            return ""
        new_token_ids = list(new_token_ids)
        text = self._stream.step(self._tokenizer, new_token_ids)
        self._held += new_token_ids
        if text is None:                    # inside a character, or only skipped special tokens
            return ""
        self._context, self._held = self._held, []
        return text

    def flush(self) -> str:
        """Return whatever is still held back (an incomplete character at the end, as U+FFFD);
        the next `add` starts a fresh stream."""
        if not self._held:
            return ""
        context_text = self._decode(self._context)
        text = self._decode(self._context + self._held)[len(context_text):]
        self._start([])
        return text

    def _decode(self, token_ids: list[int]) -> str:
        if not token_ids:
            return ""
        return self._tokenizer.decode(token_ids, skip_special_tokens=self._skip_special_tokens)


class StopStringMatcher:
    """Cuts a text stream at the first stop string, without emitting any part of it.

    Text that could be the start of a stop string is held back until the next delta shows
    whether it is one. When several stop strings occur, the one that is complete first in
    the stream wins (then the one starting first), so the result does not depend on how
    the text was split into deltas.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        if any(not stop for stop in stops):
            raise ValueError("stop strings must be non-empty")
        self._stops = tuple(stops)
        self._held = ""
        self._stopped = False

    @property
    def stopped(self) -> bool:
        return self._stopped

    def feed(self, delta: str) -> tuple[str, bool]:
        """Return (text safe to emit now, whether a stop string was found)."""
        if self._stopped:
            return "", True
        text = self._held + delta
        # Any match ends inside `delta`: the held text alone contained none.
        best: tuple[int, int] | None = None  # (end, start) of the winning match
        for stop in self._stops:
            start = text.find(stop)
            if start >= 0 and (best is None or (start + len(stop), start) < best):
                best = (start + len(stop), start)
        if best is not None:
            self._held = ""
            self._stopped = True
            return text[:best[1]], True
        keep = self._longest_partial_match(text)
        self._held = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep], False

    def flush(self) -> str:
        """Return the held-back text when the request ends for another reason."""
        held, self._held = self._held, ""
        return "" if self._stopped else held

    def _longest_partial_match(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of a stop string."""
        longest = 0
        for stop in self._stops:
            for length in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:length]):
                    longest = length
                    break
        return longest
