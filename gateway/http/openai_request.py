"""An OpenAI request body as the front end's GenerationRequest. Fields that would change the
answer but are not supported (n > 1, logprobs, penalties, tools, ...) are refused naming the
field; fields that change nothing here (user, metadata, store, ...) are ignored.

Defaults are OpenAI's: temperature 1, top_p 1; max_tokens 16 on /v1/completions and up to the
context on /v1/chat/completions. Extensions as vLLM spells them: top_k, ignore_eos,
stop_token_ids; and ours: speculation ("auto" | "off" | N, the gRPC API's max_draft).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from gateway.frontend import GenerationRequest, RequestError
from gateway.http.chat_template import ChatTemplate
from minedraft.sampling_params import SamplingParams

COMPLETION_MAX_TOKENS = 16          # OpenAI's default on /v1/completions
UNTIL_CONTEXT = 2**31 - 1           # chat's default: the front end clamps it to the context left
DEFAULT_TEMPERATURE = 1.0           # OpenAI's
CHAT_ROLES = ("system", "developer", "user", "assistant")

# The front end names fields as the gRPC API does; these are the OpenAI API's names for them.
_OPENAI_NAMES = {"sampling.temperature": "temperature", "sampling.top_p": "top_p", "sampling.top_k": "top_k",
                 "sampling.seed": "seed", "sampling.stop": "stop", "sampling.stop_token_ids": "stop_token_ids",
                 "sampling.ignore_eos": "ignore_eos", "sampling.max_draft": "speculation",
                 "prompt_token_ids": "prompt"}


@dataclass(frozen=True)
class OpenAIRequest:
    generation: GenerationRequest
    model: str | None                   # as the client named it (None: not named)
    stream: bool
    include_usage: bool                 # stream_options.include_usage: a last chunk with the usage
    names: Mapping[str, str]            # the front end's field names -> this request's OpenAI names


def _refuse(field: str, message: str) -> RequestError:
    return RequestError(grpc.StatusCode.INVALID_ARGUMENT, f"{field}: {message}", field)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _bool(body: dict, name: str) -> bool:
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise _refuse(name, f"must be true or false, got {value!r}")
    return bool(value)


def _refuse_unsupported(body: dict) -> None:
    """Fields whose being ignored would change the answer the client expects."""
    n = body.get("n")
    if n is not None and n != 1:
        raise _refuse("n", f"only n = 1 is supported, got {n!r}")
    best_of = body.get("best_of")
    if best_of is not None and best_of != 1:
        raise _refuse("best_of", f"only best_of = 1 is supported, got {best_of!r}")
    for name in ("logprobs", "top_logprobs"):
        if body.get(name) is not None and body.get(name) is not False:
            raise _refuse(name, "log probabilities are not supported")
    for name in ("presence_penalty", "frequency_penalty"):
        if body.get(name) not in (None, 0):
            raise _refuse(name, "penalties are not supported (give 0 or leave it out)")
    for name, what in (("echo", "echoing the prompt"), ("suffix", "a suffix"), ("logit_bias", "logit bias"),
                       ("tools", "tool calling"), ("functions", "function calling")):
        if body.get(name):
            raise _refuse(name, f"{what} is not supported")
    response_format = body.get("response_format")
    if response_format is not None and (not isinstance(response_format, dict) or
                                        response_format.get("type") != "text"):
        raise _refuse("response_format", "only {\"type\": \"text\"} is supported")


def _max_draft(value: Any) -> int | None:
    if value is None or value == "auto":
        return None
    if value == "off":
        return 0
    if _is_int(value) and value >= 0:
        return value
    raise _refuse("speculation", f"must be \"auto\", \"off\" or a draft length N >= 0, got {value!r}")


def _sampling(body: dict, max_tokens_names: tuple[str, ...], default_max_tokens: int) -> tuple[SamplingParams, str]:
    """-> (the parameters, the name the client gave max_tokens by)."""
    max_tokens_name = next((name for name in max_tokens_names if body.get(name) is not None), max_tokens_names[0])
    max_tokens = body.get(max_tokens_name)
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    elif stop is not None and not isinstance(stop, list):
        raise _refuse("stop", f"must be a string or a list of strings, got {stop!r}")

    def given(name: str, default: Any) -> Any:
        value = body.get(name)
        return default if value is None else value

    try:
        params = SamplingParams(
            temperature=given("temperature", DEFAULT_TEMPERATURE), top_p=given("top_p", 1.0),
            top_k=given("top_k", 0), max_tokens=default_max_tokens if max_tokens is None else max_tokens,
            stop=stop or [], stop_token_ids=given("stop_token_ids", []), ignore_eos=given("ignore_eos", False),
            seed=body.get("seed"))
    except ValueError as err:      # SamplingParams' messages start with the field's name
        message = str(err)
        if message.startswith("max_tokens"):
            message = max_tokens_name + message[len("max_tokens"):]
        raise RequestError.invalid(message) from None
    return params, max_tokens_name


def _openai_request(body: dict, prompt: str | list[int], prompt_field: str, *, id_prefix: str,
                    max_tokens_names: tuple[str, ...], default_max_tokens: int,
                    add_special_tokens: bool) -> OpenAIRequest:
    """What both endpoints share, around the prompt each reads its own way."""
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _refuse("model", f"must be a string, got {model!r}")
    stream = _bool(body, "stream")
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, dict):
        raise _refuse("stream_options", f"must be an object, got {stream_options!r}")
    include_usage = _bool(stream_options, "include_usage")
    params, max_tokens_name = _sampling(body, max_tokens_names, default_max_tokens)
    if isinstance(prompt, str) and not prompt.strip():
        raise _refuse(prompt_field, "empty or only whitespace")
    generation = GenerationRequest(prompt=prompt, params=params, max_draft=_max_draft(body.get("speculation")),
                                   client_id=f"{id_prefix}-{uuid.uuid4().hex}", add_special_tokens=add_special_tokens)
    names = {**_OPENAI_NAMES, "sampling.max_tokens": max_tokens_name, "prompt": prompt_field}
    return OpenAIRequest(generation, model, stream, include_usage, names)


def completion_request(body: dict) -> OpenAIRequest:
    """POST /v1/completions: `prompt` is text or token ids (or a list holding one of either)."""
    _refuse_unsupported(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if not isinstance(prompt, str) and not (isinstance(prompt, list) and prompt and all(map(_is_int, prompt))):
        reason = "required" if prompt is None else "must be a string or a list of token ids (one prompt a request)"
        raise _refuse("prompt", reason)
    return _openai_request(body, prompt, "prompt", id_prefix="cmpl", max_tokens_names=("max_tokens",),
                           default_max_tokens=COMPLETION_MAX_TOKENS, add_special_tokens=True)


def _content(content: Any, field: str) -> str:
    """A message's text: a string, or text parts (joined); null for an empty assistant turn."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        if all(isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
               for part in content):
            return "".join(part["text"] for part in content)
        raise _refuse(field, "only text parts ({\"type\": \"text\", \"text\": ...}) are supported")
    raise _refuse(field, f"must be a string or a list of text parts, got {content!r}")


def _messages(value: Any) -> list[dict[str, str]]:
    if not isinstance(value, list) or not value:
        raise _refuse("messages", "required: a non-empty list of messages")
    messages = []
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise _refuse(where, "must be an object with role and content")
        role = message.get("role")
        if role not in CHAT_ROLES:
            raise _refuse(f"{where}.role", f"{role!r} is not supported (one of {', '.join(CHAT_ROLES)})")
        if message.get("tool_calls"):
            raise _refuse(f"{where}.tool_calls", "tool calls are not supported")
        # "developer" is OpenAI's newer name for "system", which chat templates know.
        messages.append({"role": "system" if role == "developer" else role,
                         "content": _content(message.get("content"), f"{where}.content")})
    return messages


def chat_request(body: dict, template: ChatTemplate | None) -> OpenAIRequest:
    """POST /v1/chat/completions: `messages` rendered by the model's chat template."""
    _refuse_unsupported(body)
    messages = _messages(body.get("messages"))
    if template is None:
        raise _refuse("messages", "the served model has no chat template (tokenizer_config.json "
                                  "chat_template); use /v1/completions")
    prompt = template.render(messages)
    return _openai_request(body, prompt, "messages", id_prefix="chatcmpl",
                           max_tokens_names=("max_completion_tokens", "max_tokens"),
                           default_max_tokens=UNTIL_CONTEXT, add_special_tokens=False)
