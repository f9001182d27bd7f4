"""In-process generation: continuous batching over the same Drafter, Verifier and runner
that the services wrap. Used by tests as the reference and by baseline benchmarks.

Modes: `ar` (target alone) and `sd` (sequential speculative decoding: draft every running
request, then verify them all). The batch-parallel mode lives in the gateway's Batch Manager.
Its tokenizer is transformers' (the `peers` extra), the reference the baselines share.
"""

from __future__ import annotations

import random
import time
from collections import deque
from dataclasses import dataclass

from minedraft.config import RunnerConfig
from minedraft.drafter import Drafter
from minedraft.extras import require
from minedraft.kv_cache import OutOfBlocks
from minedraft.metrics import AcceptanceStats
from minedraft.model.hub import resolve_checkpoint
from minedraft.model_runner import ModelRunner
from minedraft.sampling_params import SamplingParams
from minedraft.sequence import FinishReason, Sequence
from minedraft.verifier import Verifier

MODES = ("ar", "sd")   # in-process; psd needs the services


@dataclass(frozen=True)
class StepTiming:
    batch_size: int
    num_draft: int        # k of the step (0 for ar)
    draft_s: float        # drafter busy time for the step
    verify_s: float       # verifier busy time for the step


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str
    stats: AcceptanceStats


class LLM:
    def __init__(self, target: str, draft: str | None = None, *, dtype: str = "float32",
                 device: str = "cpu", draft_device: str | None = None, block_size: int = 16,
                 num_blocks: int = 2048, num_threads: int = 0, target_revision: str | None = None,
                 draft_revision: str | None = None) -> None:
        """target, draft: checkpoint directories or Hugging Face ids (at their revisions)."""
        transformers = require("transformers", "peers", "minedraft.llm.LLM (its tokenizer)")
        target_dir = str(resolve_checkpoint(target, target_revision))
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(target_dir)
        self.verifier = Verifier(ModelRunner(RunnerConfig(
            model_path=target_dir, dtype=dtype, device=device, block_size=block_size,
            num_blocks=num_blocks, num_threads=num_threads)))
        self.drafter = None
        if draft is not None:
            self.drafter = Drafter(ModelRunner(RunnerConfig(
                model_path=str(resolve_checkpoint(draft, draft_revision)), dtype=dtype,
                device=draft_device or device, block_size=block_size, num_blocks=num_blocks)))
        model_cfg = self.verifier.runner.model_config
        self.eos_token_ids = model_cfg.eos_token_ids or (
            (self.tokenizer.eos_token_id,) if self.tokenizer.eos_token_id is not None else ())
        self.max_model_len = model_cfg.max_position
        self._next_id = 0
        self.step_timings: list[StepTiming] = []   # one per step of the last generate()

    def generate(self, prompts: list[str] | list[list[int]],
                 params: SamplingParams | list[SamplingParams] | None = None,
                 mode: str = "ar", k: int = 4, max_batch: int = 8) -> list[RequestOutput]:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if mode == "sd" and self.drafter is None:
            raise ValueError("mode 'sd' needs a draft model")
        if k < 0:
            raise ValueError(f"k must be >= 0, got {k}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if not isinstance(params, list):
            params = [params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(params)} sampling params for {len(prompts)} prompts")
        seqs = [self._new_sequence(p, sp) for p, sp in zip(prompts, params)]
        self.step_timings = []
        waiting: deque[Sequence] = deque(seqs)
        running: list[Sequence] = []
        capacity = max_batch          # lowered when the KV cache runs out, raised as requests finish
        while waiting or running:
            while waiting and len(running) < capacity:
                running.append(self._admit(waiting.popleft()))
            try:
                self._step(running, k if mode == "sd" else 0)
            except OutOfBlocks:
                if len(running) == 1:
                    raise
                victim = running.pop()                     # recompute it later, tokens kept
                self._release(victim)
                waiting.appendleft(victim)
                capacity = len(running)
                continue
            for seq in [s for s in running if s.is_finished]:
                running.remove(seq)
                self._release(seq)
                capacity = min(max_batch, capacity + 1)
        return [self._output(s) for s in seqs]

    def _new_sequence(self, prompt: str | list[int], params: SamplingParams) -> Sequence:
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if not ids:
            raise ValueError("prompt is empty")
        if len(ids) >= self.max_model_len:
            raise ValueError(f"prompt has {len(ids)} tokens; the model's limit is {self.max_model_len}")
        seed = params.seed if params.seed is not None else random.getrandbits(63)
        self._next_id += 1
        return Sequence(f"req-{self._next_id}", ids, params, seed, self.eos_token_ids, self.max_model_len)

    def _admit(self, seq: Sequence) -> Sequence:
        self.verifier.add_request(seq.request_id, seq.token_ids, seq.params, seq.seed)
        if self.drafter is not None:
            self.drafter.add_request(seq.request_id, seq.token_ids, seq.params, seq.seed)
        return seq

    def _release(self, seq: Sequence) -> None:
        self.verifier.remove_request(seq.request_id)
        if self.drafter is not None:
            self.drafter.remove_request(seq.request_id)

    def _step(self, running: list[Sequence], k: int) -> None:
        ks = [s.draft_length(k) for s in running]
        start = time.perf_counter()
        if k > 0:
            drafts = self.drafter.draft([(s.request_id, ki) for s, ki in zip(running, ks)]).draft_token_ids
        else:
            drafts = [[] for _ in running]
        drafted_at = time.perf_counter()
        new_tokens = self.verifier.verify([(s.request_id, d) for s, d in zip(running, drafts)])
        self.step_timings.append(StepTiming(len(running), k, drafted_at - start, time.perf_counter() - drafted_at))
        for seq, ki, tokens in zip(running, ks, new_tokens):
            if k > 0:
                seq.stats.record(ki, len(tokens) - 1)
                self.drafter.append_tokens(seq.request_id, tokens)
            seq.append(tokens)

    def _output(self, seq: Sequence) -> RequestOutput:
        ids = seq.output_token_ids
        text_ids = ids[:-1] if seq.finish_reason == FinishReason.STOP else ids
        return RequestOutput(seq.request_id, seq.prompt_token_ids, list(ids),
                             self.tokenizer.decode(text_ids, skip_special_tokens=True),
                             seq.finish_reason.value, seq.stats)
