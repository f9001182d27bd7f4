"""The target side: verifies drafts with the lossless coupled rejection sampler.

One forward per batch scores every request's unverified tokens plus its k_i drafts
(k_i + 1 logits rows each); plain autoregressive decoding is the k_i = 0 case of the
same call, and a new request's prefill is simply a long first chunk. The verifier owns
the verified token sequence of each request: what it returns is the diff to append.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from minedraft.constants import acceptance_rates_valid
from minedraft.engine_requests import RequestState, RequestTable, sampling_rows
from minedraft.model_runner import ForwardChunk
from minedraft.rejection_sampler import rejection_sample
from minedraft.sampling import VERIFY_STREAM, processed_probs, request_noise
from minedraft.sampling_params import SamplingParams


class Verifier(RequestTable):
    def __init__(self, runner, synthetic_acceptance: float | Sequence[float] | None = None) -> None:
        """synthetic_acceptance: FOR BENCHMARKS ONLY. Accept each draft token with this
        probability whatever the models say (output is then not the target's), so step
        timings can be studied on random-weight models of real sizes. Several rates: new
        requests take them in turn (the first request the first rate, and so on), a workload
        whose requests draft well and badly at rates the benchmark sets."""
        super().__init__(runner)
        rates = None if synthetic_acceptance is None else (
            (synthetic_acceptance,) if isinstance(synthetic_acceptance, (int, float)) else tuple(synthetic_acceptance))
        if rates is not None and not acceptance_rates_valid(rates):
            raise ValueError(f"synthetic_acceptance must be rates in [0, 1], got {synthetic_acceptance}")
        self.synthetic_rates = rates
        self._synthetic_rate: dict[str, float] = {}     # request id -> the rate it took
        self._admitted = 0

    @property
    def synthetic_acceptance(self) -> float | None:
        """The mean synthetic rate (None outside benchmark mode), as GetInfo reports it."""
        return None if self.synthetic_rates is None else sum(self.synthetic_rates) / len(self.synthetic_rates)

    def add_request(self, request_id: str, token_ids: list[int], params: SamplingParams, seed: int) -> None:
        super().add_request(request_id, token_ids, params, seed)
        if self.synthetic_rates is not None:
            self._synthetic_rate[request_id] = self.synthetic_rates[self._admitted % len(self.synthetic_rates)]
            self._admitted += 1

    def remove_request(self, request_id: str) -> None:
        super().remove_request(request_id)
        self._synthetic_rate.pop(request_id, None)

    def verify(self, requests: list[tuple[str, list[int]]]) -> list[list[int]]:
        """requests: (request_id, draft_token_ids) -> per request the accepted drafts plus one
        recovered or bonus token. Draft tokens are all it needs: coupled verification never
        reads the drafter's probabilities."""
        states = [self._requests[rid] for rid, _ in requests]
        chunks = []
        for (rid, drafts), state in zip(requests, states):
            unverified = self.uncached_tokens(rid)
            chunks.append(ForwardChunk(rid, unverified + list(drafts), num_logits=len(drafts) + 1))
        logits = self.runner.forward(chunks)                        # [sum(k_i + 1), V]
        ks = [len(drafts) for _, drafts in requests]
        params = [s.params for s in states]
        temperature, top_k, top_p = sampling_rows(params, [k + 1 for k in ks], logits.device)
        target_probs = processed_probs(logits, temperature, top_k, top_p)
        uniform, exponential = self._noise(states, ks, logits)
        device = logits.device
        draft_token_ids = torch.tensor([t for _, drafts in requests for t in drafts],
                                       dtype=torch.int64, device=device)
        is_greedy = torch.tensor([p.is_greedy for p in params], dtype=torch.bool, device=device)
        new_tokens = rejection_sample(draft_token_ids, ks, target_probs, is_greedy, exponential)
        if self.synthetic_rates is not None:        # after the real sampler, so timings stay real
            new_tokens = self._synthetic(requests, states, target_probs, uniform)
        for (rid, _), state, tokens in zip(requests, states, new_tokens):
            state.token_ids.extend(tokens)
            self.runner.reconcile(rid, state.token_ids)
        return new_tokens

    def _synthetic(self, requests, states, target_probs: torch.Tensor, uniform: torch.Tensor) -> list[list[int]]:
        """Benchmark mode: accept each draft with its request's synthetic rate, then emit the
        target's most likely token at the first rejected (or bonus) position."""
        argmax = target_probs.argmax(dim=-1).tolist()
        draws = uniform.tolist()
        out, row = [], 0
        for (rid, drafts), state in zip(requests, states):
            rate, accepted = self._synthetic_rate[rid], 0
            while accepted < len(drafts) and draws[row + accepted] <= rate:
                accepted += 1
            out.append(list(drafts[:accepted]) + [argmax[row + accepted]])
            row += len(drafts) + 1
        return out

    def _noise(self, states: list[RequestState], ks: list[int], logits: torch.Tensor):
        """Noise keyed by (seed, position of the token decided): batching-independent, and the
        same the drafter raced on for that position (Drafter._sample)."""
        rows = sum(k + 1 for k in ks)
        vocab = logits.shape[-1]
        positions = [list(range(len(s.token_ids), len(s.token_ids) + k + 1)) for s, k in zip(states, ks)]
        if all(s.params.is_greedy for s in states):     # no race to run: greedy rows take the argmax
            exponential = torch.ones(rows, vocab, device=logits.device)
            if self.synthetic_rates is None:
                return torch.ones(rows, device=logits.device), exponential
            # Synthetic verdicts need only each row's uniform, its first output whatever the
            # vocabulary: a whole row of noise per token verified would tax drafting layouts.
            uniform, _ = request_noise([s.seed for s in states], positions, VERIFY_STREAM, 1, logits.device)
            return uniform, exponential
        return request_noise([s.seed for s in states], positions, VERIFY_STREAM, vocab, logits.device)
