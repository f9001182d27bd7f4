"""transformers on the same machine and prompts: the peers our numbers are read against,
and the in-process measurement of our own runner beside them."""

from __future__ import annotations

import argparse
import os
import time


def llm_tokens_per_s(llm, prompts: list[str], max_tokens: int, mode: str, k: int, batch: int) -> float:
    """Greedy, fixed output length, through the in-process `LLM`. -> output tokens/s."""
    from minedraft.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, mode=mode, k=k, max_batch=batch)
    return sum(len(o.token_ids) for o in outputs) / (time.perf_counter() - start)


def load_peer(target: str, draft: str | None):
    """transformers' tokenizer, target and assistant (draft) model, from checkpoint directories
    or Hugging Face ids."""
    import torch

    from minedraft.extras import require
    from minedraft.model.hub import resolve_checkpoint

    transformers = require("transformers", "peers", "the transformers baselines (--peers, scripts/bench_core.py)")
    target_dir = str(resolve_checkpoint(target))
    tokenizer = transformers.AutoTokenizer.from_pretrained(target_dir)
    tokenizer.padding_side = "left"
    model = transformers.AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    assistant = (transformers.AutoModelForCausalLM.from_pretrained(str(resolve_checkpoint(draft)), dtype=torch.float32)
                 .eval() if draft else None)
    return tokenizer, model, assistant


def transformers_generate(tokenizer, model, prompts: list[str], new_tokens: int, batch: int,
                          assistant=None) -> float:
    """Greedy, fixed output length; batches left-padded. -> output tokens/s."""
    import torch

    produced = 0
    start = time.perf_counter()
    for i in range(0, len(prompts), batch):
        enc = tokenizer(prompts[i:i + batch], return_tensors="pt", padding=True)
        kwargs = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                      pad_token_id=tokenizer.pad_token_id)
        if assistant is not None:
            kwargs["assistant_model"] = assistant
        with torch.no_grad():
            out = model.generate(**enc, **kwargs)
        produced += (out.shape[1] - enc["input_ids"].shape[1]) * out.shape[0]
    return produced / (time.perf_counter() - start)


def peer_rows(args: argparse.Namespace, prompts: list[str], concurrency: int) -> list[dict]:
    """transformers in this process on all cores (--all-cpus' count of threads): batched generate
    at batch C on the run's prompts, and assisted generation (speculative, batch 1 only) on the
    first MIN_PROMPTS of them (at batch 1 more prompts change nothing but the time: at its
    60-80 tok/s here, 256 of them would take three to four and a half minutes a round at
    C = 64), at the same output length."""
    import torch

    from minedraft.bench.pace import probed
    from minedraft.bench.runs import MIN_PROMPTS
    from minedraft.service.placement import parse_cpus

    torch.set_num_threads(len(parse_cpus(args.all_cpus)) or os.cpu_count() or 1)
    tokenizer, model, assistant = load_peer(args.target, args.draft)
    rows = []
    for mode, batch, helper, measured in [("hf-generate", concurrency, None, prompts),
                                          ("hf-assisted", 1, assistant, prompts[:MIN_PROMPTS])]:
        # Warm-up, as our services get one: a first call's one-off costs are no part of the rate.
        transformers_generate(tokenizer, model, prompts[:batch], 4, batch, helper)
        tps, pace = probed(lambda: transformers_generate(tokenizer, model, measured, args.max_tokens, batch, helper))
        rows.append({"mode": mode, "k": 0, "concurrency": concurrency if helper is None else 1,
                     "output_tokens_per_s": tps, "peer_batch": batch, "same_as_ar": True, **pace})
    return rows
