"""transformers on the same machine and prompts: the peers our numbers are read against."""

from __future__ import annotations

import time


def load_peer(target: str, draft: str | None):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    assistant = AutoModelForCausalLM.from_pretrained(draft, dtype=torch.float32).eval() if draft else None
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
