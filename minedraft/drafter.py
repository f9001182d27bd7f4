"""The draft side of speculative decoding: proposes k tokens per request.

Keeps each request's verified tokens and its draft KV; learns newly verified tokens as a
diff (`append_tokens`) and drops rejected drafts from its cache through the runner's
`reconcile`. Drafting for a batch is k ragged forwards: the first carries each request's
catch-up tokens (its whole prompt when new, else the one or two tokens verified since),
the rest one drafted token each.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minedraft.model_runner import ForwardChunk, ModelRunner
from minedraft.sampling import DRAFT_STREAM, processed_probs, request_noise, sample_with_noise
from minedraft.sampling_params import SamplingParams


@dataclass
class _DraftState:
    token_ids: list[int]
    params: SamplingParams
    seed: int


@dataclass
class DraftOutput:
    draft_token_ids: list[list[int]]      # per request, k_i tokens
    draft_probs: torch.Tensor | None      # [sum k_i, V] float32 when any request samples, else None


def sampling_rows(params: list[SamplingParams], rows: list[int], device) -> tuple[torch.Tensor, ...]:
    """Per-row temperature [N], top_k [N], top_p [N] from per-request params and row counts."""
    temperature = torch.tensor([p.temperature for p, n in zip(params, rows) for _ in range(n)],
                               dtype=torch.float32, device=device)
    top_k = torch.tensor([p.top_k for p, n in zip(params, rows) for _ in range(n)],
                         dtype=torch.int64, device=device)
    top_p = torch.tensor([p.top_p for p, n in zip(params, rows) for _ in range(n)],
                         dtype=torch.float32, device=device)
    return temperature, top_k, top_p


class Drafter:
    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self._requests: dict[str, _DraftState] = {}

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._requests

    def add_request(self, request_id: str, token_ids: list[int], params: SamplingParams, seed: int) -> None:
        if request_id in self._requests:
            raise ValueError(f"request {request_id!r} already exists")
        if not token_ids:
            raise ValueError(f"request {request_id!r}: token_ids is empty")
        self._requests[request_id] = _DraftState(list(token_ids), params, seed)

    def append_tokens(self, request_id: str, new_token_ids: list[int]) -> None:
        """Tokens verified since the last step (accepted drafts + recovered/bonus token)."""
        state = self._requests[request_id]
        state.token_ids.extend(new_token_ids)
        self.runner.reconcile(request_id, state.token_ids)

    def remove_request(self, request_id: str) -> None:
        self._requests.pop(request_id, None)
        self.runner.free(request_id)

    def draft(self, requests: list[tuple[str, int]]) -> DraftOutput:
        """requests: (request_id, k_i) -> k_i draft tokens each (k_i may be 0)."""
        states = [self._requests[rid] for rid, _ in requests]
        ks = [k for _, k in requests]
        drafts: list[list[int]] = [[] for _ in requests]
        prob_rows: list[list[torch.Tensor]] = [[] for _ in requests]
        any_sampled = any(not s.params.is_greedy and k > 0 for s, k in zip(states, ks))
        active = [i for i, k in enumerate(ks) if k > 0]
        chunks = [ForwardChunk(requests[i][0], self._catch_up(requests[i][0], states[i])) for i in active]
        for j in range(max(ks, default=0)):
            logits = self.runner.forward(chunks)                                   # [len(active), V]
            tokens = self._sample(logits, [states[i] for i in active],
                                  [len(states[i].token_ids) + j for i in active], any_sampled)
            token_list, probs = tokens
            for row, i in enumerate(active):
                drafts[i].append(token_list[row])
                if probs is not None:
                    prob_rows[i].append(probs[row])
            active = [i for i in active if ks[i] > j + 1]
            chunks = [ForwardChunk(requests[i][0], [drafts[i][-1]]) for i in active]
        draft_probs = None
        if any_sampled:
            rows = [row for per_request in prob_rows for row in per_request]
            draft_probs = torch.stack(rows) if rows else None
        return DraftOutput(drafts, draft_probs)

    def _catch_up(self, request_id: str, state: _DraftState) -> list[int]:
        """Verified tokens not yet in the draft cache (at least one, to get next-token logits)."""
        cached = self.runner.reconcile(request_id, state.token_ids)
        if cached == len(state.token_ids):
            cached -= 1
            self.runner.truncate(request_id, cached)
        return state.token_ids[cached:]

    def _sample(self, logits: torch.Tensor, states: list[_DraftState], positions: list[int],
                any_sampled: bool) -> tuple[list[int], torch.Tensor | None]:
        """One draft token per row; probs [rows, V] only when some request samples."""
        if not any_sampled:
            return logits.argmax(dim=-1).tolist(), None
        params = [s.params for s in states]
        temperature, top_k, top_p = sampling_rows(params, [1] * len(states), logits.device)
        probs = processed_probs(logits, temperature, top_k, top_p)
        _, exponential = request_noise([s.seed for s in states], [[p] for p in positions],
                                       DRAFT_STREAM, logits.shape[-1], logits.device)
        return sample_with_noise(probs, exponential).tolist(), probs
