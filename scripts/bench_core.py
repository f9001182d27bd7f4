"""Decode throughput of the project's runner vs transformers, side by side in one run.

Same bundled model, same held-out prompts, greedy, fixed output length:
  ar batch 1 and 16   vs  transformers `generate` (batch 1 and 16, left padding)
  sd batch 1          vs  transformers assisted generation (`assistant_model=`, batch 1)
"""

from __future__ import annotations

import argparse
import json

import torch

from minedraft import bundled
from minedraft.bench.peers import llm_tokens_per_s, load_peer, transformers_generate
from minedraft.llm import LLM


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--json", help="also write the numbers to this file")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    prompts = bundled.load_prompts(args.num_prompts)
    llm = LLM(bundled.TARGET, bundled.DRAFT, dtype="float32")
    tokenizer, target, draft = load_peer(bundled.TARGET, bundled.DRAFT)
    llm_tokens_per_s(llm, prompts[:2], 8, "sd", 2, 2)                                   # warm-up
    transformers_generate(tokenizer, target, prompts[:2], 8, 2)

    few = prompts[:max(2, args.num_prompts // 4)]      # batch-1 rows use fewer prompts
    rows = [
        ("ar, batch 1", llm_tokens_per_s(llm, few, args.new_tokens, "ar", 0, 1),
         transformers_generate(tokenizer, target, few, args.new_tokens, 1), "generate"),
        ("ar, batch 16", llm_tokens_per_s(llm, prompts, args.new_tokens, "ar", 0, 16),
         transformers_generate(tokenizer, target, prompts, args.new_tokens, 16), "generate"),
        (f"sd k={args.k}, batch 1", llm_tokens_per_s(llm, few, args.new_tokens, "sd", args.k, 1),
         transformers_generate(tokenizer, target, few, args.new_tokens, 1, assistant=draft),
         "assisted generation"),
    ]
    print(f"bundled target, {args.threads} thread(s), greedy, {args.new_tokens} new tokens per prompt\n")
    print(f"{'workload':<18}{'minedraft tok/s':>17}{'transformers tok/s':>20}{'ratio':>8}  peer")
    for name, mine, theirs, peer in rows:
        print(f"{name:<18}{mine:>17.1f}{theirs:>20.1f}{mine / theirs:>8.2f}  {peer}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([dict(workload=n, minedraft=m, transformers=t, peer=p) for n, m, t, p in rows], f, indent=2)


if __name__ == "__main__":
    main()
