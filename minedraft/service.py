"""Plumbing shared by the drafter and verifier services: flags, CPU placement, gRPC server."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import zlib
from collections.abc import Awaitable, Callable
from typing import IO

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from minedraft.config import RunnerConfig
from minedraft.v1 import engine_pb2

logger = logging.getLogger("minedraft")


def add_runner_args(parser: argparse.ArgumentParser, default_model: str) -> None:
    parser.add_argument("--model", default=default_model, help="Hugging Face-format model directory")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
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


def resolve_device(device: str, lock_dir: str) -> tuple[str, IO | None]:
    """'cuda:auto': the first visible GPU whose lock this process can hold (replicas on one
    host spread over their GPUs); when every GPU is taken, they share round-robin.
    -> (device, the lock's file, which the caller keeps open as long as it uses the GPU)."""
    if device != "cuda:auto":
        return device, None
    import fcntl

    import torch

    count = torch.cuda.device_count()
    if count == 0:
        raise SystemExit("--device cuda:auto: no CUDA device is visible")
    os.makedirs(lock_dir, exist_ok=True)
    for index in range(count):
        handle = open(os.path.join(lock_dir, f"gpu{index}.lock"), "w")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            continue
        return f"cuda:{index}", handle
    # More replicas than GPUs: spread by host name (replicas in containers share a pid).
    return f"cuda:{zlib.crc32(f'{socket.gethostname()}:{os.getpid()}'.encode()) % count}", None


def free_port(host: str = "127.0.0.1") -> int:
    """A port free right now, for a rendezvous address handed to child processes at once.
    Another bind can take it before they do; a service's own port is better bound as 0."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def advertised_host(bind_host: str, advertise: str = "") -> str:
    """The host name peers should dial: the bind address unless it is a wildcard, in which
    case (or with 'auto') this machine's address as its own resolver sees it."""
    if advertise and advertise != "auto":
        return advertise
    if not advertise and bind_host not in ("0.0.0.0", "::", "[::]", ""):
        return bind_host
    name = socket.gethostname()
    try:
        return socket.gethostbyname(name)
    except OSError:
        return name


def parse_cpus(spec: str) -> set[int]:
    """'0,2-3' -> {0, 2, 3}."""
    cpus: set[int] = set()
    for part in filter(None, spec.split(",")):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def place_process(cpus: str) -> None:
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, parse_cpus(cpus))


async def start_server(add_servicers: Callable[[grpc.aio.Server], None], host: str, port: int,
                       service_names: list[str], port_file: str = "") -> tuple[grpc.aio.Server, int]:
    """Start a grpc.aio server with the standard health service; -> (server, bound port).

    port 0 binds any free port; port_file then tells a launcher which one, once serving
    (choosing a free port for a child ahead of time races with every other bind on the host)."""
    server = grpc.aio.server(options=[("grpc.max_send_message_length", 256 << 20),
                                      ("grpc.max_receive_message_length", 256 << 20)])
    add_servicers(server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot bind {host}:{port}")
    await server.start()
    for name in ["", *service_names]:
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    if port_file:
        partial = f"{port_file}.partial"
        with open(partial, "w") as f:
            f.write(str(bound))
        os.replace(partial, port_file)          # readers never see a half-written file
    return server, bound


def run(main: Callable[[], Awaitable[None]], log_level: str = "INFO") -> None:
    """Run a service's main coroutine on uvloop until SIGINT/SIGTERM."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        import uvloop
        runner = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency; keep a path without it
        runner = asyncio.run

    async def guarded() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        task = asyncio.ensure_future(main())
        waiter = asyncio.ensure_future(stop.wait())
        done, _ = await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            task.result()
        else:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass

    runner(guarded())


async def wait_healthy(address: str, timeout_s: float) -> None:
    """Poll a service's health endpoint until it reports SERVING."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    async with grpc.aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            try:
                reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2.0)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.aio.AioRpcError:
                pass
            if loop.time() > deadline:
                raise TimeoutError(f"{address} not healthy after {timeout_s:.0f} s")
            await asyncio.sleep(0.2)


def engine_info(runner, model_name: str, data_plane: str, data_plane_address: str = "",
                synthetic_acceptance: float | None = None) -> engine_pb2.EngineInfo:
    """GetInfo answer of a drafter or verifier: what the gateway sizes its admission by."""
    cfg = runner.model_config
    return engine_pb2.EngineInfo(
        model=model_name, vocab_size=cfg.vocab_size, eos_token_ids=list(cfg.eos_token_ids),
        max_model_len=cfg.max_position, num_blocks=runner.config.num_blocks,
        block_size=runner.config.block_size, free_blocks=runner.blocks.num_free_blocks,
        dtype=runner.config.dtype, data_plane=data_plane, data_plane_address=data_plane_address,
        synthetic_acceptance=synthetic_acceptance or 0.0)
