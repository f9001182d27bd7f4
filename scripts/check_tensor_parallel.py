"""TP = 2 against TP = 1 on the bundled target, on one device kind, printed and checked.

Two GPUs or more: the ranks on cuda:0 and cuda:1 over NCCL. One GPU: both ranks on
cuda:0 (gloo, staged through the host: the multi-process path on a single device).
`--device cpu`: gloo on the CPU (the dry run CI takes). Compares float32 logits of a
prefill, a ragged batch, decode steps and a verify chunk after a rollback, and the greedy
tokens of a short generation through the Verifier.

    python scripts/check_tensor_parallel.py [--device cuda|cpu]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time

import torch

from minedraft import bundled
from minedraft.config import RunnerConfig
from minedraft.model_runner import ForwardChunk, ModelRunner
from minedraft.parallel import TPGroup
from minedraft.sampling_params import SamplingParams
from minedraft.service.network import free_port
from minedraft.verifier import Verifier


def _tokens(n: int, seed: int) -> list[int]:
    return torch.randint(3, 3000, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _script(runner: ModelRunner) -> tuple[list[torch.Tensor], list[list[int]]]:
    a, b = _tokens(40, 1), _tokens(17, 2)
    logits = [runner.forward([ForwardChunk("a", a[:30], num_logits=30)])]
    logits.append(runner.forward([ForwardChunk("b", b, num_logits=3), ForwardChunk("a", a[30:33], num_logits=3)]))
    for i in range(3):
        logits.append(runner.forward([ForwardChunk("a", [a[33 + i]]), ForwardChunk("b", [b[i]])]))
    runner.truncate("a", runner.length("a") - 2)
    logits.append(runner.forward([ForwardChunk("a", a[36:40], num_logits=4)]))
    runner.free("a")
    runner.free("b")
    verifier = Verifier(runner)
    prompts = [_tokens(n, 10 + n) for n in (12, 5, 20)]
    for i, prompt in enumerate(prompts):
        verifier.add_request(f"g{i}", prompt, SamplingParams(), seed=i)
    out = [[] for _ in prompts]
    for _ in range(16):
        for i, tokens in enumerate(verifier.verify([(f"g{i}", []) for i in range(len(prompts))])):
            out[i].extend(tokens)
    return [t.cpu() for t in logits], out


def _runner(device: str, tp: TPGroup | None) -> ModelRunner:
    return ModelRunner(RunnerConfig(model_path=bundled.TARGET, device=device, num_blocks=64, num_threads=1), tp)


def _rank(rank: int, port: int, devices: list[str], backend: str, results) -> None:
    tp = TPGroup.create(rank, 2, "127.0.0.1", port, backend=backend, device=devices[rank])
    outcome = _script(_runner(devices[rank], tp))
    if rank == 0:
        results.put(outcome)
    tp.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device visible; use --device cpu", file=sys.stderr)
        return 2
    gpus = torch.cuda.device_count() if args.device == "cuda" else 0
    if gpus >= 2:
        devices, backend = ["cuda:0", "cuda:1"], "nccl"
    elif gpus == 1:
        devices, backend = ["cuda:0", "cuda:0"], "gloo"
    else:
        devices, backend = ["cpu", "cpu"], "gloo"
    port = free_port()
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    start = time.perf_counter()
    ranks = [ctx.Process(target=_rank, args=(r, port, devices, backend, results)) for r in range(2)]
    for proc in ranks:
        proc.start()
    tp_logits, tp_tokens = results.get(timeout=600)
    for proc in ranks:
        proc.join(60)
    tp_seconds = time.perf_counter() - start
    ref_logits, ref_tokens = _script(_runner(devices[0], None))
    max_diff = max(float((a - b).abs().max()) for a, b in zip(tp_logits, ref_logits))
    same_tokens = tp_tokens == ref_tokens
    ok = max_diff < 1e-3 and same_tokens and all(p.exitcode == 0 for p in ranks)
    print(f"tensor parallel: TP=2 ({backend} on {', '.join(devices)}) vs TP=1 on {devices[0]}: "
          f"max |logit diff| {max_diff:.2e}, greedy tokens equal={same_tokens}, "
          f"TP=2 run {tp_seconds:.1f} s -> {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
