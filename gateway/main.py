"""Start the gateway: `python -m gateway --verifier HOST:PORT [--drafter HOST:PORT ...] --mode psd`.

Drafters given with --drafter must be up at start-up; more join (and leave) at run time
through the DrafterPool admin API (its own port, on loopback by default), which
`python -m drafter_svc --register-with ADMIN_ADDRESS` calls itself.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging

import grpc

from gateway.admin import DrafterPoolServicer
from gateway.batch_manager import BatchManager, BatchManagerConfig
from gateway.frontend import Frontend
from gateway.http.server import serve_metrics, serve_openai
from gateway.liveness import VerifierWatch, supervise
from gateway.pool import DrafterPool, PoolError
from gateway.reflection import add_reflection
from gateway.servicer import GenerationServicer, server_info
from gateway.tokenizer import TextTokenizer
from minedraft.constants import ADMIN_PORT, DEFAULT_VERIFIER, GATEWAY_PORT, MAX_REQUEST_BYTES, MODES
from minedraft.help_format import ArgumentParser
from minedraft.model.hub import resolve_tokenizer
from minedraft.service.runtime import add_log_format_arg, end_with_launcher, run
from minedraft.service.security import (DialSecurity, SecurityError, ServerSecurity, add_dial_args, add_server_args,
                                        check_bind)
from minedraft.service.server import start_server, wait_healthy
from minedraft.v1 import engine_pb2, engine_pb2_grpc, generation_pb2_grpc

logger = logging.getLogger("minedraft.gateway")
ANY_PORT = -1       # --http-port any: bound on a free port, named in the port file (none picked ahead)


def http_port(text: str) -> int:
    """--http-port: a port, 0 (off) or 'any' (ANY_PORT: the port is bound, then named)."""
    if text == "any":
        return ANY_PORT
    port = int(text)
    if not 0 <= port <= 65535:
        raise ValueError(text)
    return port


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = ArgumentParser(prog="gateway", description="MineDraft gateway (public API, Batch Manager)")
    parser.add_argument("--host", default="127.0.0.1", help="public API bind address")
    parser.add_argument("--port", type=int, default=GATEWAY_PORT, help="public gRPC port")
    parser.add_argument("--port-file", default="", help="write the bound ports here once serving (with --port 0): "
                        "the public one in this file, the admin one in FILE.admin, the HTTP one in FILE.http")
    parser.add_argument("--http-port", type=http_port, default=0,
                        help="serve the OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions, "
                             "/v1/models, /health, /metrics) on this port of --host, with the public API's "
                             "TLS and API keys (0: off; 'any': a free port, named in --port-file's FILE.http); "
                             "see docs/http.md")
    parser.add_argument("--served-model-name", default="",
                        help="the model's name on the HTTP API (default: the name of the verifier's model "
                             "directory)")
    parser.add_argument("--admin-host", default="127.0.0.1",
                        help="bind address of the drafter-pool admin API (register, deregister, list); "
                             "keep it on loopback or a private network")
    parser.add_argument("--admin-port", type=int, default=ADMIN_PORT, help="drafter-pool admin gRPC port")
    parser.add_argument("--verifier", default=DEFAULT_VERIFIER, metavar="HOST:PORT", help="the verifier's address")
    parser.add_argument("--drafter", action="append", default=[], metavar="HOST:PORT",
                        help="a drafter's address; repeat for a pool (unused in ar mode). Drafters may "
                             "also join later through the admin API")
    parser.add_argument("--mode", default="auto", choices=MODES,
                        help="auto: layout and each request's draft length chosen at every step from measured "
                             "costs; ar, sd, psd: fixed, for experiments and baselines")
    parser.add_argument("--k", type=int, default=4, help="draft length (auto: the longest draft)")
    parser.add_argument("--max-batch", type=int, default=16,
                        help="requests running at once (auto; split over two batches when overlapped); "
                             "in the fixed modes, requests per batch")
    parser.add_argument("--auto-cycle-steps", type=int, default=0, help=argparse.SUPPRESS)   # tests: force switches
    parser.add_argument("--no-early-verify", dest="early_verify", action="store_false",
                        help="send a step's verify only once its drafts' call has answered (one gateway round "
                             "trip more per step; the NCCL data plane always does)")
    parser.add_argument("--max-waiting", type=int, default=1024,
                        help="requests queued beyond the batches; more are refused with RESOURCE_EXHAUSTED")
    parser.add_argument("--step-timeout", type=float, default=30.0,
                        help="least deadline of a call to the verifier (and to a drafter until it has "
                             "answered 16 calls, then 2 s), seconds; the deadline grows to 10x the slowest "
                             "recent call or the cost model's prediction")
    parser.add_argument("--drain-timeout", type=float, default=30.0,
                        help="on SIGTERM, how long requests in flight may take to finish")
    parser.add_argument("--tokenizer", default="", help="model directory with tokenizer.json, or a Hugging Face "
                        "model id (default: the verifier's model, as it names it)")
    parser.add_argument("--tokenizer-revision", default="",
                        help="branch, tag or commit of a Hugging Face tokenizer (the verifier's --revision)")
    parser.add_argument("--connect-timeout", type=float, default=300.0,
                        help="seconds to wait for the verifier (and each --drafter) to serve at start-up")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR")
    add_log_format_arg(parser)
    parser.add_argument("--metrics-port", type=int, default=0,
                        help="serve Prometheus metrics at GET /metrics on this port of --host (0: off; "
                             "the HTTP front end serves them too); see docs/metrics.md")
    add_server_args(parser, public=True)
    add_dial_args(parser, internal=True)
    args = parser.parse_args(argv)
    try:
        args.public = ServerSecurity.from_args(args)
        args.dial = DialSecurity.from_args(args, internal=True)
        check_bind(args.host, args.public, args.insecure)
    except SecurityError as err:
        parser.error(str(err))
    try:
        args.config = BatchManagerConfig(mode=args.mode, k=args.k if args.mode != "ar" else 0,
                                         max_batch=args.max_batch, kv_blocks=1, block_size=1,
                                         step_timeout_s=args.step_timeout, max_waiting=args.max_waiting,
                                         auto_cycle_steps=args.auto_cycle_steps, early_verify=args.early_verify)
    except ValueError as err:
        parser.error(str(err))
    return args


async def serve(args: argparse.Namespace) -> None:
    await wait_healthy(args.verifier, args.connect_timeout, args.dial)
    verifier_channel = args.dial.aio_channel(args.verifier)
    verifier = engine_pb2_grpc.VerifierStub(verifier_channel)
    target_info = await verifier.GetInfo(engine_pb2.EngineInfoRequest(), timeout=args.connect_timeout)
    config = dataclasses.replace(args.config, kv_blocks=target_info.num_blocks, block_size=target_info.block_size)
    if config.k + 1 >= target_info.max_model_len:
        raise SystemExit(f"--k {config.k}: a draft must fit in the model's context ({target_info.max_model_len})")
    pool = None
    if args.mode != "ar":
        pool = DrafterPool(target_info, args.dial, args.connect_timeout)
        for address in args.drafter:
            try:
                await pool.add(address)
            except PoolError as err:
                raise SystemExit(str(err)) from err
        if not args.drafter:
            logger.info("no drafter yet: steps run at k = 0 until one registers")
    manager = BatchManager(config, verifier, pool)
    try:
        tokenizer_dir = str(resolve_tokenizer(args.tokenizer or target_info.model, args.tokenizer_revision or None))
    except (FileNotFoundError, ValueError) as err:
        raise SystemExit(f"gateway: the tokenizer: {err}") from None
    tokenizer = TextTokenizer(tokenizer_dir)
    info = server_info(args.mode, config.k, args.max_batch, target_info.model, target_info.synthetic_acceptance)
    if target_info.synthetic_acceptance:
        logger.warning("the verifier runs in BENCHMARK MODE (synthetic acceptance, mean %.2f): "
                       "outputs are not the target model's", target_info.synthetic_acceptance)
    frontend = Frontend(manager, tokenizer, target_info.vocab_size, tuple(target_info.eos_token_ids),
                        target_info.max_model_len, config.k)
    servicer = GenerationServicer(frontend, info)

    def add_public_services(server: grpc.aio.Server) -> None:
        generation_pb2_grpc.add_GenerationServicer_to_server(servicer, server)
        add_reflection(server)

    served = await start_server(add_public_services,
                                args.host, args.port, ["minedraft.v1.Generation"], args.port_file,
                                credentials=args.public.credentials(), interceptors=args.public.interceptors(),
                                max_receive_bytes=MAX_REQUEST_BYTES)
    # The admin API takes the public API's keys (operators) and the internal token (drafters
    # registering themselves), over the public API's TLS.
    admin_security = dataclasses.replace(args.public, tokens=args.public.tokens + tuple(filter(None, [args.dial.token])))
    admin = await start_server(
        lambda s: generation_pb2_grpc.add_DrafterPoolServicer_to_server(DrafterPoolServicer(manager), s),
        args.admin_host, args.admin_port, ["minedraft.v1.DrafterPool"],
        f"{args.port_file}.admin" if args.port_file else "",
        credentials=admin_security.credentials(), interceptors=admin_security.interceptors())
    logger.info("gateway serving on %s:%d, pool admin on %s:%d (mode %s, k %d, m %d)", args.host, served.port,
                args.admin_host, admin.port, args.mode, config.k, args.max_batch)
    metrics = await serve_metrics(args.host, args.metrics_port) if args.metrics_port else None
    if metrics is not None:
        logger.info("metrics on http://%s:%d/metrics", args.host, metrics.port)
    http = None
    if args.http_port:
        http = await serve_openai(frontend, target_info.model, tokenizer_dir,
                                  args.served_model_name, args.host, max(0, args.http_port), args.public,
                                  f"{args.port_file}.http" if args.port_file else "")
        logger.info("OpenAI-compatible HTTP API on %s/v1", http.url)
    watch = VerifierWatch(manager, verifier_channel, served, target_info.instance_id)
    try:
        await supervise(manager, served, watch, args.drain_timeout)
    finally:
        if http is not None:
            await http.close()
        if metrics is not None:
            await metrics.close()
        await admin.server.stop(grace=1.0)
        await served.server.stop(grace=1.0)
        await verifier_channel.close()


def main(argv: list[str] | None = None) -> None:
    end_with_launcher()
    args = parse_args(argv)
    run(lambda: serve(args), args.log_level, args.log_format)


if __name__ == "__main__":
    main()
