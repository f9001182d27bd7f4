"""What the drafter and the verifier both keep per request: its verified tokens, sampling
settings and seed, beside the runner that caches its KV."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minedraft.model_runner import ModelRunner
from minedraft.protocol import params_from_proto
from minedraft.sampling_params import SamplingParams


class UnknownRequest(KeyError):
    """A step named a request this service does not hold (never added, or already freed)."""

    def __str__(self) -> str:
        return str(self.args[0])


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

    def __len__(self) -> int:
        return len(self._requests)

    def add_request(self, request_id: str, token_ids: list[int], params: SamplingParams, seed: int) -> None:
        if request_id in self._requests:
            raise ValueError(f"new_requests: request {request_id!r} already exists")
        if not token_ids:
            raise ValueError(f"new_requests: request {request_id!r}: token_ids is empty")
        self._requests[request_id] = RequestState(list(token_ids), params, seed)

    def check_tokens(self, token_ids: list[int], where: str) -> None:
        """Token ids from another process index the embedding: refuse any outside the vocabulary.
        Called once per step at the process boundary (StepCheck), not again on the way in."""
        vocab = self.runner.vocab_size
        bad = next((t for t in token_ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise ValueError(f"{where}: token id {bad} is outside the vocabulary [0, {vocab})")

    def state(self, request_id: str, where: str) -> RequestState:
        """A known request's state; an unknown id is the caller's error (UnknownRequest)."""
        state = self._requests.get(request_id)
        if state is None:
            raise UnknownRequest(f"{where}: unknown request {request_id!r}")
        return state

    def remove_request(self, request_id: str) -> None:
        """Forget a request and free its KV blocks; unknown ids are ignored."""
        self._requests.pop(request_id, None)
        self.runner.free(request_id)

    def remove_all(self) -> None:
        for request_id in list(self._requests):
            self.remove_request(request_id)

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


class StepCheck:
    """Checks one step's request names against a request table before the step changes it,
    so a refused step changes nothing. Raises UnknownRequest (NOT_FOUND) or ValueError
    (INVALID_ARGUMENT), naming the field."""

    def __init__(self, table: RequestTable, finished) -> None:
        self.table = table
        self.freed = set(finished)
        self.new_ids: set[str] = set()

    def known(self, request_id: str) -> bool:
        """Held after this step's frees and new requests are applied."""
        return request_id in self.new_ids or (request_id in self.table and request_id not in self.freed)

    def add_new(self, new_requests) -> None:
        for new in new_requests:
            where = f"new_requests: request {new.request_id!r}"
            if not new.request_id:
                raise ValueError("new_requests: request_id is empty")
            if self.known(new.request_id):
                raise ValueError(f"{where} already exists")
            if not new.token_ids:
                raise ValueError(f"{where}: token_ids is empty")
            self.table.check_tokens(list(new.token_ids), where)
            params_from_proto(new.sampling)
            self.new_ids.add(new.request_id)

    def require(self, request_id: str, field: str, freed_ok: bool = False) -> None:
        """freed_ok: a request this very step frees may be named (its drafts are dropped)."""
        if not self.known(request_id) and not (freed_ok and request_id in self.freed):
            raise UnknownRequest(f"{field}: unknown request {request_id!r}")


def sampling_rows(params: list[SamplingParams], rows: list[int], device) -> tuple[torch.Tensor, ...]:
    """Per-row temperature [N], top_k [N], top_p [N] from per-request params and row counts."""
    expanded = [p for p, n in zip(params, rows) for _ in range(n)]
    return (torch.tensor([p.temperature for p in expanded], dtype=torch.float32, device=device),
            torch.tensor([p.top_k for p in expanded], dtype=torch.int64, device=device),
            torch.tensor([p.top_p for p in expanded], dtype=torch.float32, device=device))
