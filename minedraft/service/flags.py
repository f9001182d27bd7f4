"""Command-line flags every model-holding service takes (drafter and verifier)."""

from __future__ import annotations

import argparse

from minedraft.config import RunnerConfig
from minedraft.constants import DTYPES


def add_runner_args(parser: argparse.ArgumentParser, default_model: str) -> None:
    parser.add_argument("--model", default=default_model, help="Hugging Face-format model directory")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--dtype", default="float32", choices=DTYPES)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--cpus", default="", help="CPU cores to pin to, e.g. '0' or '2-3'")
    parser.add_argument("--num-blocks", type=int, default=4096)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port-file", default="", help="write the bound port here once serving (with --port 0)")
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("--random-weights", action="store_true", help=argparse.SUPPRESS)


def runner_config(args: argparse.Namespace, device: str | None = None) -> RunnerConfig:
    return RunnerConfig(model_path=args.model, dtype=args.dtype, device=device or args.device,
                        block_size=args.block_size, num_blocks=args.num_blocks,
                        num_threads=args.threads, random_weights=args.random_weights)
