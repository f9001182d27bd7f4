"""What to run against a served model: a `minedraft generate` line for the gRPC API, and a
curl line and an `openai` snippet for the OpenAI-compatible HTTP API. `minedraft serve` prints
them once it serves; `minedraft demo` prints them for a `minedraft serve` to come."""

from __future__ import annotations

import json

from minedraft.service.security import API_KEY_ENV

PROMPT = "def fibonacci(n):"

_OPENAI_SNIPPET = '''import os
from openai import OpenAI

client = OpenAI(base_url="BASE_URL/v1", api_key=os.environ.get("API_KEY_ENV", "none"))
completion = client.completions.create(model="MODEL", prompt="PROMPT", max_tokens=32, temperature=0)
print(completion.choices[0].text)
print(completion.usage.speculation)          # this request's drafting: drafted, accepted, ...
stream = client.chat.completions.create(model="MODEL", messages=[{"role": "user", "content": "class Stack:\\n"}],
                                        max_tokens=48, stream=True)
for chunk in stream:
    print(chunk.choices[0].delta.content or "", end="", flush=True)
print()'''


def generate_example(address: str) -> str:
    """A completion over gRPC (the CLI sends $MINEDRAFT_API_KEY by itself)."""
    return f'minedraft generate "{PROMPT}" --server {address} --max-tokens 32'


def curl_example(base_url: str, model: str, with_key: bool = False) -> str:
    """A completion request; with_key: the API key from $MINEDRAFT_API_KEY."""
    body = json.dumps({"model": model, "prompt": PROMPT, "max_tokens": 32, "temperature": 0})
    key = f' -H "Authorization: Bearer ${API_KEY_ENV}"' if with_key else ""
    return f"curl {base_url}/v1/completions -H 'Content-Type: application/json'{key} -d '{body}'"


def openai_example(base_url: str, model: str) -> str:
    """A Python snippet: a completion with its speculation statistics, then a streamed chat."""
    return (_OPENAI_SNIPPET.replace("BASE_URL", base_url).replace("API_KEY_ENV", API_KEY_ENV)
            .replace("MODEL", model).replace("PROMPT", PROMPT))
