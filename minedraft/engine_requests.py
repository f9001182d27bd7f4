"""What the drafter and the verifier both keep per request: its verified tokens, sampling
settings and seed, beside the runner that caches its KV."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minedraft.model_runner import ModelRunner
from minedraft.sampling_params import SamplingParams


@dataclass
class RequestState:
    token_ids: list[int]          # verified tokens (prompt + accepted output)
    params: SamplingParams
    seed: int


class RequestTable:
    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self._requests: dict[str, RequestState] = {}

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._requests

    def add_request(self, request_id: str, token_ids: list[int], params: SamplingParams, seed: int) -> None:
        if request_id in self._requests:
            raise ValueError(f"request {request_id!r} already exists")
        if not token_ids:
            raise ValueError(f"request {request_id!r}: token_ids is empty")
        self._requests[request_id] = RequestState(list(token_ids), params, seed)

    def remove_request(self, request_id: str) -> None:
        """Forget a request and free its KV blocks; unknown ids are ignored."""
        self._requests.pop(request_id, None)
        self.runner.free(request_id)

    def uncached_tokens(self, request_id: str) -> list[int]:
        """Verified tokens not in the cache yet (the prompt when new, else the last one or two).

        Always at least one: the next position's logits need an input token, so a fully
        cached request gives back its last position.
        """
        state = self._requests[request_id]
        cached = self.runner.reconcile(request_id, state.token_ids)
        if cached == len(state.token_ids):
            cached -= 1
            self.runner.truncate(request_id, cached)
        return state.token_ids[cached:]


def sampling_rows(params: list[SamplingParams], rows: list[int], device) -> tuple[torch.Tensor, ...]:
    """Per-row temperature [N], top_k [N], top_p [N] from per-request params and row counts."""
    expanded = [p for p, n in zip(params, rows) for _ in range(n)]
    return (torch.tensor([p.temperature for p in expanded], dtype=torch.float32, device=device),
            torch.tensor([p.top_k for p in expanded], dtype=torch.int64, device=device),
            torch.tensor([p.top_p for p in expanded], dtype=torch.float32, device=device))
