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


def _generate(args: argparse.Namespace) -> int:
    import dataclasses
    import json

    from minedraft.client import Client, MineDraftError

    options = dict(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                   top_k=args.top_k, seed=args.seed, stop=args.stop, ignore_eos=args.ignore_eos)
    try:
        with Client(args.server, timeout=args.timeout) as client:
            if not args.stream:
                result = dataclasses.asdict(client.generate(args.prompt, **options))
            else:
                result = dict(text="", token_ids=[], finish_reason=None, request_id="",
                              prompt_tokens=0, stats=None)
                for chunk in client.stream(args.prompt, **options):
                    if not args.json:  # show text as it arrives
                        print(chunk.text, end="", flush=True)
                    result["text"] += chunk.text
                    result["token_ids"] += chunk.token_ids
                    result["request_id"] = chunk.request_id or result["request_id"]
                    result["prompt_tokens"] = chunk.prompt_tokens or result["prompt_tokens"]
                    if chunk.finish_reason is not None:
                        result["finish_reason"] = chunk.finish_reason
                        result["stats"] = chunk.stats and dataclasses.asdict(chunk.stats)
    except MineDraftError as error:
        print(f"error: {error.code.name}: {error.message}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result))
    elif args.stream:
        print()
    else:
        print(result["text"])
    return 0


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
    gen = sub.add_parser("generate", help="send one prompt to a running gateway")
    gen.add_argument("prompt")
    gen.add_argument("--server", default="localhost:50051", help="gateway address, HOST:PORT")
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    gen.add_argument("--ignore-eos", action="store_true")
    gen.add_argument("--timeout", type=float, default=60.0, help="seconds")
    gen.add_argument("--json", action="store_true", help="print the whole result as one JSON object")
    gen.add_argument("--stream", action="store_true", help="stream the completion as it is generated")
    gen.set_defaults(func=_generate)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
