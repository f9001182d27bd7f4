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

from minedraft.engine_requests import RequestState, RequestTable, sampling_rows
from minedraft.model_runner import ForwardChunk
from minedraft.sampling import VERIFY_STREAM, processed_probs, request_noise, sample_with_noise


@dataclass
class DraftOutput:
    draft_token_ids: list[list[int]]      # per request, k_i tokens; no probabilities: coupled
                                          # verification compares tokens only


class Drafter(RequestTable):
    def append_tokens(self, request_id: str, new_token_ids: list[int]) -> None:
        """Tokens verified since the last step (accepted drafts + recovered/bonus token)."""
        state = self.state(request_id, "updates")
        state.token_ids.extend(new_token_ids)
        self.runner.reconcile(request_id, state.token_ids)

    def catch_up(self, request_ids: list[str]) -> None:
        """Take these requests' verified tokens not yet cached into the draft KV, drafting
        nothing: one ragged forward, its logits unused. The next draft's first forward then
        carries one token a request instead of everything verified since it last drafted."""
        if request_ids:
            self.runner.forward([ForwardChunk(rid, self.uncached_tokens(rid)) for rid in request_ids])

    def draft(self, requests: list[tuple[str, int]]) -> DraftOutput:
        """requests: (request_id, k_i) -> k_i draft tokens each (k_i may be 0)."""
        states = [self._requests[rid] for rid, _ in requests]
        ks = [k for _, k in requests]
        drafts: list[list[int]] = [[] for _ in requests]
        any_sampled = any(not s.params.is_greedy and k > 0 for s, k in zip(states, ks))
        active = [i for i, k in enumerate(ks) if k > 0]
        chunks = [ForwardChunk(requests[i][0], self.uncached_tokens(requests[i][0])) for i in active]
        for j in range(max(ks, default=0)):
            logits = self.runner.forward(chunks)                                   # [len(active), V]
            token_list = self._sample(logits, [states[i] for i in active],
                                      [len(states[i].token_ids) + j for i in active], any_sampled)
            for row, i in enumerate(active):
                drafts[i].append(token_list[row])
            active = [i for i in active if ks[i] > j + 1]
            chunks = [ForwardChunk(requests[i][0], [drafts[i][-1]]) for i in active]
        return DraftOutput(drafts)

    def _sample(self, logits: torch.Tensor, states: list[RequestState], positions: list[int],
                any_sampled: bool) -> list[int]:
        """One draft token per row. A sampled row races on the noise the verifier will use for
        the same (seed, position): the draft is then the target's own sample wherever the two
        races agree, which is what coupled verification accepts."""
        if not any_sampled:
            return logits.argmax(dim=-1).tolist()
        params = [s.params for s in states]
        temperature, top_k, top_p = sampling_rows(params, [1] * len(states), logits.device)
        probs = processed_probs(logits, temperature, top_k, top_p)
        _, exponential = request_noise([s.seed for s in states], [[p] for p in positions],
                                       VERIFY_STREAM, logits.shape[-1], logits.device)
        return sample_with_noise(probs, exponential).tolist()
