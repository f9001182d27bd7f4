"""Checks of a generation request that need the model's or the server's facts (vocabulary,
context, k); the sampling fields themselves are checked by SamplingParams. Each raises
ValueError with a message that starts with the field's name (as the gRPC API spells it): the
front end (gateway/frontend.py) refuses the request with it, naming the field."""

from __future__ import annotations

import dataclasses

from minedraft.sampling_params import SamplingParams
from minedraft.v1 import generation_pb2

# Text is refused before it is tokenised when it could not fit the context even at this
# many characters per token (no tokenizer of a served model packs more): a huge prompt
# costs one length check, not seconds of tokenisation.
MAX_CHARS_PER_TOKEN = 32


def check_prompt_text(prompt: str, max_model_len: int) -> None:
    if not prompt.strip():
        raise ValueError("prompt: empty or only whitespace")
    if len(prompt) > MAX_CHARS_PER_TOKEN * max_model_len:
        raise ValueError(f"prompt: {len(prompt)} characters cannot fit the model's context of "
                         f"{max_model_len} tokens")


def check_prompt_ids(prompt_ids: list[int], vocab_size: int, max_model_len: int) -> None:
    if not prompt_ids:
        raise ValueError("prompt: empty (give prompt or prompt_token_ids)")
    bad = next((t for t in prompt_ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise ValueError(f"prompt_token_ids: {bad} is outside the vocabulary [0, {vocab_size})")
    if len(prompt_ids) >= max_model_len:
        raise ValueError(f"prompt: {len(prompt_ids)} tokens; the model's limit is {max_model_len} "
                         f"(prompt and output together)")


def check_stop_token_ids(params: SamplingParams, vocab_size: int) -> None:
    bad = next((t for t in params.stop_token_ids if t >= vocab_size), None)
    if bad is not None:
        raise ValueError(f"sampling.stop_token_ids: {bad} is outside the vocabulary [0, {vocab_size})")


def clamp_max_tokens(params: SamplingParams, prompt_len: int, max_model_len: int) -> SamplingParams:
    """max_tokens beyond the context left is clamped to it (the request would stop there
    anyway, finish reason "length"), so it never reserves KV it cannot use."""
    room = max_model_len - prompt_len
    return params if params.max_tokens <= room else dataclasses.replace(params, max_tokens=room)


def max_draft_from_proto(options: generation_pb2.SamplingOptions) -> int | None:
    """The request's cap on draft tokens a step (None = the server decides). It is the
    gateway's alone, so it stays out of SamplingParams, which goes on to the engines."""
    return options.max_draft if options.HasField("max_draft") else None


def check_max_draft(max_draft: int | None, k: int) -> None:
    if max_draft is not None and max_draft < 0:
        raise ValueError(f"sampling.max_draft: {max_draft} is negative (0 = no drafts)")
    if max_draft is not None and max_draft > k:
        raise ValueError(f"sampling.max_draft: {max_draft} is more than this server's longest draft (k = {k})")
