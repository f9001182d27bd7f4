"""The checkpoint's chat template (tokenizer_config.json `chat_template`, or chat_template.jinja),
rendered with jinja2 the way transformers' apply_chat_template renders it (a sandbox, trimmed
blocks, `raise_exception`, `strftime_now`, a `tojson` that keeps non-ASCII text), so the gateway
needs neither transformers nor torch to turn a conversation into a prompt."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import grpc
from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from gateway.frontend import RequestError

_SPECIAL_TOKENS = ("bos_token", "eos_token", "pad_token", "unk_token")


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.datetime.now().strftime(format)


def _token_text(value: Any) -> str:
    """A special token as tokenizer_config.json writes it: a string, or {"content": ...}."""
    if isinstance(value, dict):
        return str(value.get("content", ""))
    return value if isinstance(value, str) else ""


class ChatTemplate:
    def __init__(self, source: str, special_tokens: dict[str, str]) -> None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)
        env.filters["tojson"] = _tojson
        self._template = env.from_string(source)      # a broken template fails at start-up
        self._special_tokens = special_tokens

    @classmethod
    def from_model_dir(cls, model_dir: str) -> ChatTemplate | None:
        """The directory's template; None when it has none (chat is then refused)."""
        config_path = Path(model_dir) / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        jinja_path = Path(model_dir) / "chat_template.jinja"
        source = jinja_path.read_text() if jinja_path.is_file() else config.get("chat_template")
        if isinstance(source, list):            # named templates: [{"name": "default", "template": ...}]
            source = next((t.get("template") for t in source if t.get("name") == "default"), None)
        if not isinstance(source, str) or not source:
            return None
        return cls(source, {name: _token_text(config.get(name)) for name in _SPECIAL_TOKENS})

    def render(self, messages: list[dict[str, str]]) -> str:
        """The prompt for a conversation, the assistant's turn opened."""
        try:
            return self._template.render(messages=messages, add_generation_prompt=True, **self._special_tokens)
        except TemplateError as err:
            raise RequestError(grpc.StatusCode.INVALID_ARGUMENT,
                               f"messages: the model's chat template refused them: {err}", "messages") from None
