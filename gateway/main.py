"""Start the gateway: `python -m gateway --verifier HOST:PORT [--drafter HOST:PORT ...] --mode psd`.

Drafters given with --drafter must be up at start-up; more join (and leave) at run time
through the DrafterPool API, which `python -m drafter_svc --register-with` calls itself.
"""

from __future__ import annotations

import argparse
import asyncio
import logging

import grpc

from gateway.batch_manager import BatchManager, BatchManagerConfig
from gateway.pool import DrafterPool, PoolError
from gateway.servicer import DrafterPoolServicer, GenerationServicer, server_info
from gateway.tokenizer import TextTokenizer
from minedraft.constants import DEFAULT_VERIFIER, GATEWAY_PORT, MODES
from minedraft.service.runtime import run
from minedraft.service.server import start_server, wait_healthy
from minedraft.v1 import engine_pb2, engine_pb2_grpc, generation_pb2_grpc

logger = logging.getLogger("minedraft.gateway")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gateway", description="MineDraft gateway (public API, Batch Manager)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=GATEWAY_PORT)
    parser.add_argument("--port-file", default="", help="write the bound port here once serving (with --port 0)")
    parser.add_argument("--verifier", default=DEFAULT_VERIFIER)
    parser.add_argument("--drafter", action="append", default=[], metavar="HOST:PORT",
                        help="a drafter's address; repeat for a pool (unused in ar mode). Drafters may "
                             "also join later through the DrafterPool API")
    parser.add_argument("--mode", default="psd", choices=MODES)
    parser.add_argument("--k", type=int, default=4, help="draft length")
    parser.add_argument("--max-batch", type=int, default=8, help="requests per batch (m)")
    parser.add_argument("--tokenizer", default="", help="model directory with tokenizer.json "
                        "(default: the verifier's model directory)")
    parser.add_argument("--connect-timeout", type=float, default=300.0)
    parser.add_argument("--log-level", default="INFO")
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    await wait_healthy(args.verifier, args.connect_timeout)
    verifier_channel = grpc.aio.insecure_channel(args.verifier)
    verifier = engine_pb2_grpc.VerifierStub(verifier_channel)
    target_info = await verifier.GetInfo(engine_pb2.EngineInfoRequest())
    pool = None
    if args.mode != "ar":
        pool = DrafterPool(target_info, args.connect_timeout)
        for address in args.drafter:
            try:
                await pool.add(address)
            except PoolError as err:
                raise SystemExit(str(err)) from err
        if not args.drafter:
            logger.warning("no drafter yet: steps run at k = 0 until one registers")
    kv_blocks, block_size = target_info.num_blocks, target_info.block_size
    config = BatchManagerConfig(mode=args.mode, k=args.k if args.mode != "ar" else 0,
                             max_batch=args.max_batch, kv_blocks=kv_blocks, block_size=block_size)
    manager = BatchManager(config, verifier, pool)
    tokenizer = TextTokenizer(args.tokenizer or target_info.model)
    info = server_info(args.mode, config.k, args.max_batch, target_info.model, target_info.synthetic_acceptance)
    if target_info.synthetic_acceptance:
        logger.warning("the verifier runs in BENCHMARK MODE (synthetic acceptance %.2f): "
                       "outputs are not the target model's", target_info.synthetic_acceptance)
    servicer = GenerationServicer(manager, tokenizer, target_info.vocab_size,
                                  tuple(target_info.eos_token_ids), target_info.max_model_len, info)
    pool_servicer = DrafterPoolServicer(manager)

    def add_servicers(server: grpc.aio.Server) -> None:
        generation_pb2_grpc.add_GenerationServicer_to_server(servicer, server)
        generation_pb2_grpc.add_DrafterPoolServicer_to_server(pool_servicer, server)

    served = await start_server(add_servicers, args.host, args.port,
                                      ["minedraft.v1.Generation", "minedraft.v1.DrafterPool"], args.port_file)
    logger.info("gateway serving on %s:%d (mode %s, k %d, m %d)", args.host, served.port, args.mode, config.k, args.max_batch)
    loop_task = asyncio.ensure_future(manager.run())
    try:
        await served.server.wait_for_termination()
    finally:
        loop_task.cancel()
        await served.server.stop(grace=1.0)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    run(lambda: serve(args), args.log_level)


if __name__ == "__main__":
    main()
