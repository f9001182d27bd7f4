"""Start the verifier service: `python -m verifier_svc --model DIR --port N [--tp N]`.

The verifier runs as N tensor-parallel ranks of one process group. Rank 0 serves the gRPC
API and hands each step to the others (see `steps.py`). Three ways to start the ranks:

  --tp N                      this process is rank 0 and starts ranks 1..N-1 itself
  --tp N --tp-rank R --tp-address HOST:PORT
                              exactly one rank (multi-host, or your own process manager)
  torchrun --nproc-per-node N -m verifier_svc ...
                              RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT are read
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import subprocess
import sys
from typing import TYPE_CHECKING

from minedraft import bundled
from minedraft.constants import DATA_PLANES, VERIFIER_PORT, acceptance_rates_valid
from minedraft.service.flags import add_runner_args, resolve_model, runner_config, service_parser
from minedraft.service.network import advertised_host, listening_socket
from minedraft.service.placement import compute_thread, parse_cpus, place_process
from minedraft.service.runtime import add_log_format_arg, configure_logging, end_with_launcher, run
from minedraft.service.security import SecurityError, ServerSecurity, add_internal_token_arg, add_server_args
from minedraft.service.server import start_server

if TYPE_CHECKING:
    from minedraft.service.cpu_lending import CoreLender

logger = logging.getLogger("minedraft.verifier")


def build_parser() -> argparse.ArgumentParser:
    parser = service_parser("verifier_svc", "MineDraft verifier: serves the target model's steps, verifying "
                                            "the drafts that drafters send over the data plane")
    add_runner_args(parser, default_model=bundled.TARGET)
    add_log_format_arg(parser)
    parser.add_argument("--port", type=int, default=VERIFIER_PORT, help="gRPC port to serve on (0: any free port)")
    parser.add_argument("--advertise-host", default="",
                        help="host name drafters reach this verifier's data plane at "
                             "(default: --host, or this machine's address when binding all interfaces; "
                             "'auto' = this machine's address)")
    parser.add_argument("--data-plane", default="gloo", choices=DATA_PLANES,
                        help="how drafts arrive: a torch.distributed pair group per drafter, a Unix domain socket "
                             "per drafter (unix: drafters on this host only), or gRPC in-band")
    parser.add_argument("--tp", "--tp-size", dest="tp", type=int, default=0,
                        help="tensor-parallel ranks (default: WORLD_SIZE from torchrun, else 1)")
    parser.add_argument("--tp-rank", type=int, default=None,
                        help="run only this rank (default: RANK from torchrun, else rank 0 starting the rest)")
    parser.add_argument("--tp-address", default="",
                        help="HOST:PORT of rank 0's rendezvous store (default: MASTER_ADDR:MASTER_PORT, "
                             "or a free local port when this process starts the ranks)")
    parser.add_argument("--borrow-cpus", default="",
                        help="cores the drafter lends, e.g. '1' or '2-3': a step that says borrow_cpus (plain "
                             "decoding, nothing drafting) computes on them too, until a step without it. "
                             "CPU and --tp 1 only (otherwise ignored): a GPU computes on its own device, and "
                             "tensor-parallel ranks run in lockstep, so one rank's extra cores would only make "
                             "the others wait (default: none)")
    parser.add_argument("--synthetic-acceptance", type=float, nargs="+", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--benchmark-only", action="store_true", help=argparse.SUPPRESS)
    add_server_args(parser, public=False)
    add_internal_token_arg(parser)
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.serving = ServerSecurity.from_args(args, internal=True)
    except SecurityError as err:
        parser.error(str(err))
    if args.synthetic_acceptance is not None and not args.benchmark_only:
        parser.error("--synthetic-acceptance changes outputs and exists for benchmarks only; "
                     "it needs --benchmark-only")
    if args.synthetic_acceptance is not None and not acceptance_rates_valid(args.synthetic_acceptance):
        parser.error(f"--synthetic-acceptance: rates must be in [0, 1], got {args.synthetic_acceptance}")
    try:
        lent = parse_cpus(args.borrow_cpus)
    except ValueError:
        parser.error(f"--borrow-cpus: expected cores like '1' or '2-3,5', got {args.borrow_cpus!r}")
    if hasattr(os, "sched_getaffinity") and lent - os.sched_getaffinity(0):
        parser.error(f"--borrow-cpus: cores {sorted(lent - os.sched_getaffinity(0))} are not available "
                     "to this process")
    env = os.environ
    if args.tp_rank is None and "RANK" in env and "WORLD_SIZE" in env:     # torchrun
        args.tp_rank, args.tp = int(env["RANK"]), int(env["WORLD_SIZE"])
        args.tp_address = args.tp_address or f"{env.get('MASTER_ADDR', '127.0.0.1')}:{env.get('MASTER_PORT', '29500')}"
    args.tp = args.tp or 1
    if args.tp < 1:
        parser.error(f"--tp must be >= 1, got {args.tp}")
    if args.tp_rank is not None and not 0 <= args.tp_rank < args.tp:
        parser.error(f"--tp-rank must be in [0, {args.tp}), got {args.tp_rank}")
    if args.tp_rank is not None and args.tp > 1 and not args.tp_address:
        parser.error("--tp-rank needs --tp-address HOST:PORT (rank 0's rendezvous store)")
    args.tp_listener = None         # rank 0's store socket, where it binds before the other ranks start
    return args


def rank_device(device: str, rank: int, tp: int) -> tuple[str, str]:
    """-> (this rank's device, the model group's backend).

    'cuda' gives each rank its own GPU (cuda:<local rank>) and NCCL; 'cuda:N' puts every
    rank on GPU N, which NCCL refuses, so their collectives go through gloo (a check on a
    one-GPU machine, not a way to serve); cpu is gloo.
    """
    if tp == 1 or not device.startswith("cuda"):
        return device, "gloo"
    if device == "cuda":
        return f"cuda:{int(os.environ.get('LOCAL_RANK', rank))}", "nccl"
    logger.warning("all %d ranks share %s: collectives are staged through host memory (slow)", tp, device)
    return device, "gloo"


def rank_cpus(cpus: str, rank: int, tp: int) -> str:
    """Split a --cpus list evenly over the ranks when there is at least one core each."""
    cores = sorted(parse_cpus(cpus))
    if tp == 1 or len(cores) < tp:
        return cpus
    share = len(cores) // tp
    return ",".join(str(c) for c in cores[rank * share:(rank + 1) * share])


def core_lender(args: argparse.Namespace, cpus: str) -> CoreLender | None:
    """-> the switch onto the --borrow-cpus cores, or None when there is nothing to borrow
    (said once, at start-up). cpus: this process's own cores ('' = all it may use)."""
    from minedraft.service.cpu_lending import CoreLender

    if not args.borrow_cpus:
        return None
    own = parse_cpus(cpus) or (os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set())
    lent = parse_cpus(args.borrow_cpus) - own
    reason = ("tensor-parallel ranks run in lockstep" if args.tp > 1
              else f"the device is {args.device}, not cpu" if args.device != "cpu"
              else "this system cannot set a thread's cores" if not hasattr(os, "sched_setaffinity")
              else "they are this verifier's own cores already (--cpus)" if not lent else "")
    if reason:
        logger.warning("--borrow-cpus %s: borrowing is off, %s", args.borrow_cpus, reason)
        return None
    logger.info("while nothing drafts, computing on cores %s too", sorted(lent))
    return CoreLender(own, args.threads, lent)


def _spawn_followers(args: argparse.Namespace, argv: list[str]) -> list[subprocess.Popen]:
    """Start ranks 1.. of a local group. Without --tp-address rank 0's store socket is bound
    first, on any free port, and that port is the one they are given: a port picked free and
    bound later could be taken in between (the gateway's own gRPC bind once took a port so
    picked for its HTTP server)."""
    if not args.tp_address:
        args.tp_listener = listening_socket("127.0.0.1")
        args.tp_address = f"127.0.0.1:{args.tp_listener.getsockname()[1]}"
    base = [sys.executable, "-m", "verifier_svc", *argv, "--tp", str(args.tp), "--tp-address", args.tp_address]
    return [subprocess.Popen(base + ["--tp-rank", str(rank)]) for rank in range(1, args.tp)]


def _build(args: argparse.Namespace, rank: int):
    # torch (and with it OpenMP) loads before the process is placed on its own cores: libgomp
    # counts the cores it may use once, at load, and with more threads than that count it
    # stops spinning between parallel regions. Loaded on one own core, the bundled target's
    # step for one request took 7.1 ms on two threads after borrowing a second core, against
    # 2.8 ms loaded with both in reach (one process, the same switch as CoreLender's).
    import torch  # noqa: F401

    from minedraft.model_runner import ModelRunner
    from minedraft.parallel import TPGroup
    from minedraft.verifier import Verifier
    from verifier_svc.steps import StepExecutor

    device, backend = rank_device(args.device, rank, args.tp)
    cpus = rank_cpus(args.cpus, rank, args.tp)
    lender = core_lender(args, cpus) if rank == 0 else None   # before placing: '' means the cores it has
    place_process(cpus)
    if args.tp == 1:
        tp = TPGroup.single(device)
    else:
        host, _, port = args.tp_address.rpartition(":")
        tp = TPGroup.create(rank, args.tp, host, int(port), backend=backend, device=device,
                            listener=args.tp_listener if rank == 0 else None)
    config = runner_config(args, device=device)
    verifier = Verifier(ModelRunner(config, tp=tp), synthetic_acceptance=args.synthetic_acceptance)
    return StepExecutor(verifier, tp, lender=lender)


async def serve(args: argparse.Namespace) -> None:
    from minedraft.data_plane import DraftPairings
    from minedraft.v1 import engine_pb2_grpc
    from verifier_svc.servicer import VerifierServicer

    compute = compute_thread("verify")         # the model loads where its steps will run
    executor = await asyncio.get_running_loop().run_in_executor(compute, _build, args, 0)
    if args.synthetic_acceptance is not None:
        logger.warning("BENCHMARK MODE: drafts are accepted with probability %s (new requests take the "
                       "rates in turn) whatever the models say; outputs are not the target model's",
                       " or ".join(f"{p:.2f}" for p in args.synthetic_acceptance))
    pairings = DraftPairings(args.data_plane, args.host, advertised_host(args.host, args.advertise_host),
                             device=executor.device)
    servicer = VerifierServicer(executor, pairings, args.model, compute)
    served = await start_server(lambda s: engine_pb2_grpc.add_VerifierServicer_to_server(servicer, s),
                                args.host, args.port, ["minedraft.v1.Verifier"], args.port_file,
                                credentials=args.serving.credentials(), interceptors=args.serving.interceptors())
    logger.info("verifier serving %s on %s:%d (tp %d, data plane %s)", args.model, args.host, served.port,
                args.tp, args.data_plane)
    try:
        await served.server.wait_for_termination()
    finally:
        await served.server.stop(grace=1.0)
        await asyncio.get_running_loop().run_in_executor(servicer.compute, executor.stop_followers)
        pairings.close()


def follow(args: argparse.Namespace) -> None:
    configure_logging(args.log_level, args.log_format)
    executor = _build(args, args.tp_rank)
    logger.info("verifier rank %d/%d ready", args.tp_rank, args.tp)
    executor.follow()


def main(argv: list[str] | None = None) -> None:
    end_with_launcher()
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    resolve_model(args, "verifier_svc")
    if args.tp_rank not in (None, 0):
        follow(args)
        return
    followers = _spawn_followers(args, argv) if args.tp > 1 and args.tp_rank is None else []
    try:
        run(lambda: serve(args), args.log_level, args.log_format)
    finally:
        for proc in followers:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    main()
