"""Command-line flags every model-holding service takes (drafter and verifier), and the
parser both build on: every flag's default shown in --help, and --version."""

from __future__ import annotations

import argparse

from minedraft import __version__, help_format
from minedraft.config import PACKED_WEIGHTS, RunnerConfig
from minedraft.constants import DTYPES
from minedraft.model.hub import resolve_checkpoint


def service_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """A service's parser: every flag's default shown in --help (help_format), and --version."""
    parser = help_format.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return parser


def add_runner_args(parser: argparse.ArgumentParser, default_model: str) -> None:
    parser.add_argument("--model", default=default_model,
                        help="the model: a Hugging Face-format directory, or a Hugging Face Hub id (org/name) "
                             "taken from the local Hugging Face cache (HF_HOME), downloaded into it first "
                             "when missing unless HF_HUB_OFFLINE is set")
    parser.add_argument("--revision", default=None,
                        help="with a Hub id for --model: the branch, tag or commit to load (default: main)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--dtype", default="float32", choices=DTYPES,
                        help="precision of the weights, activations and KV cache")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--packed-weights", default="auto", choices=PACKED_WEIGHTS,
                        help="on CPU in float32: pack the linear weights once for oneDNN, so a verify of k + 1 "
                             "tokens reads them once (auto: where they outgrow the last-level cache; a packed "
                             "layer holds its weight twice); see docs/architecture.md")
    parser.add_argument("--cpus", default="",
                        help="CPU cores to pin to, e.g. '0' or '2-3' (default: no pinning)")
    parser.add_argument("--num-blocks", type=int, default=4096,
                        help="KV cache size in blocks of --block-size tokens, shared by all requests")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per KV cache block")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address the gRPC server binds (0.0.0.0: every interface)")
    parser.add_argument("--port-file", default="", help="write the bound port here once serving (with --port 0)")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR")
    parser.add_argument("--random-weights", action="store_true", help=argparse.SUPPRESS)


def resolve_model(args: argparse.Namespace, prog: str) -> None:
    """--model and --revision -> args.model_path, a local checkpoint directory (fetched from the
    Hub first if need be). Called at start-up, not while parsing (a deployment's flags are
    checked where its models are not); a model that cannot be had ends the process at once."""
    try:
        args.model_path = str(resolve_checkpoint(args.model, args.revision))
    except (FileNotFoundError, ValueError) as err:
        raise SystemExit(f"{prog}: error: {err}") from None


def runner_config(args: argparse.Namespace, device: str | None = None) -> RunnerConfig:
    model_path = getattr(args, "model_path", None) or str(resolve_checkpoint(args.model, args.revision))
    device = device or args.device
    if args.packed_weights == "on":             # refused before the model loads, by the runner's own rule
        import torch

        from minedraft.model.packed_linear import packing_available
        if not packing_available(torch.device(device), getattr(torch, args.dtype)):
            raise SystemExit(f"--packed-weights on: packed weights are for float32 on CPU with oneDNN, "
                             f"not {args.dtype} on {device}")
    return RunnerConfig(model_path=model_path, dtype=args.dtype, device=device,
                        block_size=args.block_size, num_blocks=args.num_blocks, num_threads=args.threads,
                        random_weights=args.random_weights, packed_weights=args.packed_weights)
