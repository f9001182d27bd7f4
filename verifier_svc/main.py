"""Start the verifier service: `python -m verifier_svc --model DIR --port N`.

One process holds the whole target for now. Tensor parallelism will run the verifier as N
ranks of one process group, with rank 0 serving this gRPC API and handing each step to
the others; nothing in the servicer assumes a single rank beyond this entry point.
"""

from __future__ import annotations

import argparse
import asyncio
import logging

from minedraft import bundled
from minedraft.model_runner import ModelRunner
from minedraft.service import add_runner_args, place_process, run, runner_config, start_server
from minedraft.v1 import engine_pb2_grpc
from minedraft.verifier import Verifier
from verifier_svc.servicer import VerifierServicer

logger = logging.getLogger("minedraft.verifier")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="verifier_svc", description="MineDraft verifier (target model)")
    add_runner_args(parser, default_model=bundled.TARGET)
    parser.add_argument("--port", type=int, default=50061)
    parser.add_argument("--data-plane", default="gloo", choices=["gloo", "nccl", "inband"],
                        help="how drafts arrive: a torch.distributed pair group, or gRPC in-band")
    parser.add_argument("--data-plane-port", type=int, default=0,
                        help="rendezvous port of the pair group (required for gloo/nccl)")
    parser.add_argument("--synthetic-acceptance", type=float, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--benchmark-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.synthetic_acceptance is not None and not args.benchmark_only:
        parser.error("--synthetic-acceptance changes outputs and exists for benchmarks only; "
                     "it needs --benchmark-only")
    return args


async def serve(args: argparse.Namespace) -> None:
    from minedraft.data_plane import DistributedDraftReceiver, InBandDraftReceiver

    place_process(args.cpus)
    verifier = Verifier(ModelRunner(runner_config(args)), synthetic_acceptance=args.synthetic_acceptance)
    if args.synthetic_acceptance is not None:
        logger.warning("BENCHMARK MODE: drafts are accepted with probability %.2f whatever the "
                       "models say; outputs are not the target model's", args.synthetic_acceptance)
    receiver = None
    address = ""
    if args.data_plane == "inband":
        receiver = InBandDraftReceiver()
    else:
        if not args.data_plane_port:
            raise SystemExit("--data-plane-port is required for the gloo and nccl data planes")
        address = f"{args.host}:{args.data_plane_port}"
    servicer = VerifierServicer(verifier, receiver, args.data_plane, address, args.model)
    server, port = await start_server(lambda s: engine_pb2_grpc.add_VerifierServicer_to_server(servicer, s),
                                      args.host, args.port, ["minedraft.v1.Verifier"])
    logger.info("verifier serving %s on %s:%d (data plane %s)", args.model, args.host, port, args.data_plane)
    if args.data_plane != "inband":
        # The pair group forms when the drafter joins; it is built on the compute thread,
        # so steps queue behind it until then.
        def connect() -> None:
            servicer.receiver = DistributedDraftReceiver(args.host, args.data_plane_port,
                                                         backend=args.data_plane, device=args.device)
            logger.info("data plane %s formed on %s", args.data_plane, address)

        await asyncio.get_running_loop().run_in_executor(servicer.compute, connect)
    try:
        await server.wait_for_termination()
    finally:
        await server.stop(grace=1.0)
        if servicer.receiver is not None:
            servicer.receiver.close()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    run(lambda: serve(args), args.log_level)


if __name__ == "__main__":
    main()
