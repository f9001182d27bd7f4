"""Start the drafter service: `python -m drafter_svc --model DIR --verifier HOST:PORT --port N`.

At start-up the drafter asks the verifier how drafts travel (GetInfo) and joins that data
plane: a torch.distributed pair group at the verifier's rendezvous address, or in-band
gRPC calls to the verifier's PutDrafts.
"""

from __future__ import annotations

import argparse
import asyncio
import logging

import grpc

from minedraft import bundled
from minedraft.drafter import Drafter
from minedraft.model_runner import ModelRunner
from minedraft.service import add_runner_args, place_process, run, runner_config, start_server, wait_healthy
from minedraft.v1 import engine_pb2, engine_pb2_grpc
from drafter_svc.servicer import DrafterServicer

logger = logging.getLogger("minedraft.drafter")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="drafter_svc", description="MineDraft drafter (draft model)")
    add_runner_args(parser, default_model=bundled.DRAFT)
    parser.add_argument("--port", type=int, default=50071)
    parser.add_argument("--verifier", default="127.0.0.1:50061", help="the verifier's gRPC address")
    parser.add_argument("--connect-timeout", type=float, default=300.0)
    return parser.parse_args(argv)


def _inband_put(verifier_address: str):
    """A blocking PutDrafts call, made from the drafter's send thread."""
    from minedraft.data_plane import encode_payload

    channel = grpc.insecure_channel(verifier_address, options=[("grpc.max_send_message_length", 256 << 20)])
    stub = engine_pb2_grpc.VerifierStub(channel)

    def put(payload) -> None:
        stub.PutDrafts(engine_pb2.DraftPayload(**encode_payload(payload)), timeout=60.0)

    return put


async def serve(args: argparse.Namespace) -> None:
    from minedraft.data_plane import DistributedDraftSender, InBandDraftSender

    place_process(args.cpus)
    config = runner_config(args)
    drafter = Drafter(ModelRunner(config))
    await wait_healthy(args.verifier, args.connect_timeout)
    async with grpc.aio.insecure_channel(args.verifier) as channel:
        info = await engine_pb2_grpc.VerifierStub(channel).GetInfo(engine_pb2.EngineInfoRequest())
    if info.data_plane == "inband":
        sender = InBandDraftSender(_inband_put(args.verifier))
    else:
        host, _, port = info.data_plane_address.rpartition(":")
        loop = asyncio.get_running_loop()
        sender = await loop.run_in_executor(None, lambda: DistributedDraftSender(
            host, int(port), backend=info.data_plane, device=args.device))
    servicer = DrafterServicer(drafter, sender, info.data_plane, args.model, config.torch_dtype)
    server, port = await start_server(lambda s: engine_pb2_grpc.add_DrafterServicer_to_server(servicer, s),
                                      args.host, args.port, ["minedraft.v1.Drafter"])
    logger.info("drafter serving %s on %s:%d (data plane %s)", args.model, args.host, port, info.data_plane)
    try:
        await server.wait_for_termination()
    finally:
        await server.stop(grace=1.0)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    run(lambda: serve(args), args.log_level)


if __name__ == "__main__":
    main()
