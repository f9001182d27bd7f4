"""Answers in OpenAI's shapes: a whole completion, the chunks of a streamed one (server-sent
events, `data: {...}` then `data: [DONE]`), and `usage` with our acceptance statistics under
`usage.speculation` (minedraft/metrics.py defines them once)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from gateway.request import ActiveRequest

DONE = b"data: [DONE]\n\n"


def sse(data: dict) -> bytes:
    """One server-sent event carrying `data` as JSON."""
    return b"data: " + json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


def usage(req: ActiveRequest) -> dict:
    prompt_tokens, completion_tokens = len(req.seq.prompt_token_ids), len(req.seq.output_token_ids)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens, "speculation": req.seq.stats.to_dict()}


@dataclass(frozen=True)
class Completion:
    """/v1/completions' objects for one request."""

    id: str
    model: str
    created: int

    whole_object = "text_completion"
    chunk_object = "text_completion"

    def _envelope(self, object_name: str, choices: list[dict]) -> dict:
        return {"id": self.id, "object": object_name, "created": self.created, "model": self.model,
                "choices": choices}

    def whole(self, text: str, finish_reason: str | None, usage: dict) -> dict:
        return {**self._envelope(self.whole_object, [self._choice(text, finish_reason, whole=True)]),
                "usage": usage}

    def chunk(self, text: str, finish_reason: str | None = None) -> dict:
        """A streamed delta: new text, or (empty) with the finish reason."""
        return self._envelope(self.chunk_object, [self._choice(text, finish_reason, whole=False)])

    def opening(self) -> list[dict]:
        """Chunks sent before the first text."""
        return []

    def usage_chunk(self, usage: dict) -> dict:
        """stream_options.include_usage: the last chunk, with no choices."""
        return {**self._envelope(self.chunk_object, []), "usage": usage}

    def _choice(self, text: str, finish_reason: str | None, whole: bool) -> dict:
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}


@dataclass(frozen=True)
class ChatCompletion(Completion):
    """/v1/chat/completions' objects: the text is the assistant's message, streamed as deltas
    after one that names the role."""

    whole_object = "chat.completion"
    chunk_object = "chat.completion.chunk"

    def opening(self) -> list[dict]:
        return [self._envelope(self.chunk_object, [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                    "logprobs": None, "finish_reason": None}])]

    def _choice(self, text: str, finish_reason: str | None, whole: bool) -> dict:
        if whole:
            return {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                    "finish_reason": finish_reason}
        return {"index": 0, "delta": {"content": text} if text else {}, "logprobs": None,
                "finish_reason": finish_reason}
