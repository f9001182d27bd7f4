"""Streaming text from token ids: incremental detokenisation and stop strings.

Pure Python over any tokenizer with a ``decode`` method, so the gateway can use it without
importing torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

# How many prompt tokens give the first output token its left context. Tokenizers that
# strip a leading space at the start of a decode (sentencepiece) need at least one.
_PROMPT_CONTEXT_TOKENS = 5
_REPLACEMENT_CHAR = "\ufffd"


class Decoder(Protocol):
    """The one tokenizer method detokenisation needs (any Hugging Face tokenizer has it)."""

    def decode(self, token_ids: list[int], skip_special_tokens: bool = ...) -> str: ...


class IncrementalDetokenizer:
    """Turns a growing list of output token ids into text deltas, one call per step.

    Decoding the whole output each step costs O(n) per token, so only a short window is
    decoded: ``ids[prefix_offset:]``, whose first part ``ids[prefix_offset:read_offset]`` was
    already emitted and is decoded again only to give the new tokens their left context
    (the delta is the window's text past the context's text). Byte-level BPE may split one
    UTF-8 character over several tokens; while the window's text ends in U+FFFD the
    character is incomplete, so nothing is emitted until a later token completes it.
    """

    def __init__(self, tokenizer: Decoder, prompt_token_ids: Sequence[int],
                 skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        context = list(prompt_token_ids[-_PROMPT_CONTEXT_TOKENS:])
        if self._decode(context).endswith(_REPLACEMENT_CHAR):
            # The prompt ends inside a character: its tail would merge with the output's
            # first bytes and the context would not be a prefix of the window's text.
            context = []
        self._token_ids: list[int] = context
        self._prefix_offset = 0  # start of the decode window (context begins here)
        self._read_offset = len(context)  # tokens before this have been emitted

    def add(self, new_token_ids: Sequence[int]) -> str:
        """Append output tokens; return the text they complete (may be empty)."""
        self._token_ids.extend(new_token_ids)
        return self._emit(hold_incomplete=True)

    def flush(self) -> str:
        """Return whatever is still held back (an incomplete character at the end)."""
        return self._emit(hold_incomplete=False)

    def _emit(self, hold_incomplete: bool) -> str:
        if self._read_offset == len(self._token_ids):
            return ""
        context_text = self._decode(self._token_ids[self._prefix_offset:self._read_offset])
        window_text = self._decode(self._token_ids[self._prefix_offset:])
        if hold_incomplete and window_text.endswith(_REPLACEMENT_CHAR):
            return ""
        if len(window_text) <= len(context_text):
            # The new tokens decode to nothing (skipped special tokens): forget them and
            # keep the context, which still gives the next tokens their left side.
            del self._token_ids[self._read_offset:]
            return ""
        delta = window_text[len(context_text):]
        # Drop ids that can never enter a window again; offsets index into what is kept.
        del self._token_ids[:self._read_offset]
        self._prefix_offset = 0
        self._read_offset = len(self._token_ids)
        return delta

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
