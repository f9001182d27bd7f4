"""The public API's core, shared by the gRPC servicer and the HTTP front end, so both check,
tokenise, queue, stream and cancel a request the same way:

    req = await frontend.build(GenerationRequest(...))   # every field checked, nothing reserved
    frontend.submit(req)                                   # queued (or refused: queue full)
    async for event in frontend.events(req): ...           # its text deltas, then its finish

A refusal or failure is a RequestError: a gRPC status code (the categories both transports
map from), the field at fault and the message. Each transport words it its own way.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

import grpc

from gateway.batch_manager import BatchManager, Overloaded
from gateway.request import ActiveRequest, StreamEvent
from gateway.validation import (check_max_draft, check_prompt_ids, check_prompt_text, check_stop_token_ids,
                                clamp_max_tokens)
from minedraft.detokenizer import IncrementalDetokenizer, StopStringMatcher
from minedraft.sampling_params import SamplingParams
from minedraft.sequence import Sequence

# A refusal's message starts with the field's name: "sampling.top_p must be ...",
# "prompt: empty ...", "messages[2].content: ...".
_FIELD = re.compile(r"[A-Za-z_][\w.\[\]]*(?=[: ])")


class RequestError(Exception):
    """Why a request was refused or failed. `field` names the request field at fault (as the
    gRPC API spells it, or as the HTTP API does for fields only it has); None: no field's."""

    def __init__(self, code: grpc.StatusCode, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field

    @classmethod
    def invalid(cls, message: str) -> RequestError:
        """INVALID_ARGUMENT for a message that starts with the field's name."""
        match = _FIELD.match(message)
        return cls(grpc.StatusCode.INVALID_ARGUMENT, message, match.group(0) if match else None)


class Tokenizer(Protocol):
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str: ...


@dataclass(frozen=True)
class GenerationRequest:
    """One generation as either transport asks for it, its fields already read off the wire."""

    prompt: str | list[int]                 # text, or token ids
    params: SamplingParams
    max_draft: int | None = None            # draft tokens a step at most; None = the server decides
    client_id: str = ""                     # the caller's name for it ('' = the server names it)
    add_special_tokens: bool = True         # False: the text holds them already (a chat template's)


class Frontend:
    def __init__(self, manager: BatchManager, tokenizer: Tokenizer, vocab_size: int,
                 eos_token_ids: tuple[int, ...], max_model_len: int, k: int) -> None:
        self.manager = manager
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        self.k = k
        self._ids = itertools.count(1)

    async def build(self, request: GenerationRequest) -> ActiveRequest:
        """Check every field before anything is reserved; the first bad one is refused with
        INVALID_ARGUMENT naming it (see docs/reliability.md)."""
        if self.manager.unavailable:
            raise RequestError(grpc.StatusCode.UNAVAILABLE, self.manager.unavailable)
        try:
            check_max_draft(request.max_draft, self.k)
            prompt_ids = await self._prompt_ids(request)
            params = clamp_max_tokens(request.params, len(prompt_ids), self.max_model_len)
            check_stop_token_ids(params, self.vocab_size)
        except ValueError as err:
            raise RequestError.invalid(str(err)) from None
        # Server-side ids are unique whatever clients send: a client's own id is kept for its
        # answers only, so no client can take, or collide with, another request's id.
        number = next(self._ids)
        request_id = f"{request.client_id}#{number}" if request.client_id else f"req-{number}"
        seed = params.seed if params.seed is not None else random.getrandbits(63)
        seq = Sequence(request_id, prompt_ids, params, seed, self.eos_token_ids, self.max_model_len)
        req = ActiveRequest(seq, IncrementalDetokenizer(self.tokenizer, prompt_ids), StopStringMatcher(params.stop),
                            client_id=request.client_id or request_id, max_draft=request.max_draft)
        if not self.manager.admission.fits_ever(req):
            raise RequestError.invalid("sampling.max_tokens: prompt + max_tokens exceed the KV cache capacity")
        return req

    async def _prompt_ids(self, request: GenerationRequest) -> list[int]:
        if isinstance(request.prompt, str) and request.prompt:
            check_prompt_text(request.prompt, self.max_model_len)
            loop = asyncio.get_running_loop()
            prompt_ids = await loop.run_in_executor(None, self.tokenizer.encode, request.prompt,
                                                    request.add_special_tokens)
        else:
            prompt_ids = list(request.prompt)
        check_prompt_ids(prompt_ids, self.vocab_size, self.max_model_len)
        return prompt_ids

    def submit(self, req: ActiveRequest) -> None:
        """Queue the request; RESOURCE_EXHAUSTED when the queue is full."""
        try:
            self.manager.submit(req)
        except Overloaded as err:
            raise RequestError(grpc.StatusCode.RESOURCE_EXHAUSTED, str(err)) from None

    async def events(self, req: ActiveRequest) -> AsyncIterator[StreamEvent]:
        """A submitted request's events up to and including its final one; a failure (the
        verifier lost, ...) is raised as RequestError. However the caller stops reading, the
        request's work stops with it."""
        try:
            while True:
                event: StreamEvent = await req.events.get()
                if event.error is not None:
                    code, message = event.error
                    raise RequestError(code, message)
                yield event
                if event.finish_reason is not None:
                    return
        finally:
            self.release(req)

    def release(self, req: ActiveRequest) -> None:
        """The caller has gone: stop the request's work unless it has finished."""
        if not req.done:
            self.manager.cancel(req.request_id)
