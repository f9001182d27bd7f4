"""The `minedraft` command."""

from __future__ import annotations

import argparse
import sys
import time


def _demo(args: argparse.Namespace) -> int:
    import torch

    from minedraft import bundled
    from minedraft.llm import LLM
    from minedraft.sampling_params import SamplingParams

    torch.set_num_threads(args.threads)
    llm = LLM(bundled.TARGET, bundled.DRAFT)
    prompts = bundled.load_prompts(args.num_prompts)
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
    print(f"bundled pair, {len(prompts)} held-out prompts, {args.max_tokens} tokens each, "
          f"batch {args.batch}, {args.threads} thread(s)\n")
    print("prompt:\n" + prompts[0] + "\n")
    rows, reference = [], None
    for mode, k in [("ar", 0)] + [("sd", k) for k in args.k]:
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, mode=mode, k=k, max_batch=args.batch)
        elapsed = time.perf_counter() - start
        tokens = sum(len(o.token_ids) for o in outputs)
        stats = outputs[0].stats
        for o in outputs[1:]:
            stats.merge(o.stats)
        same = "reference" if reference is None else (
            "yes" if [o.token_ids for o in outputs] == reference else "NO")
        reference = reference or [o.token_ids for o in outputs]
        label = mode if mode == "ar" else f"sd k={k}"
        rows.append((label, tokens / elapsed, stats.mean_acceptance_length if k else 1.0, same))
        if mode == "ar":
            print("ar completion:\n" + outputs[0].text + "\n")
    print(f"{'mode':<10}{'tokens/s':>10}{'mean acc. len':>15}  greedy output == ar")
    for label, tps, mal, same in rows:
        print(f"{label:<10}{tps:>10.1f}{mal:>15.2f}  {same}")
    return 0 if all(r[3] != "NO" for r in rows) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="minedraft", description="LLM serving with batch-parallel speculative decoding")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="generate with the bundled model pair in every mode")
    demo.add_argument("--num-prompts", type=int, default=8)
    demo.add_argument("--max-tokens", type=int, default=64)
    demo.add_argument("--batch", type=int, default=8)
    demo.add_argument("--threads", type=int, default=1)
    demo.add_argument("--k", type=int, nargs="+", default=[2, 4])
    demo.set_defaults(func=_demo)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
