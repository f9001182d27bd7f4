"""Start a drafter: `python -m drafter_svc --model DIR --verifier HOST:PORT --port N`.

At start-up the drafter takes an identity, asks the verifier for a data-plane pairing of its
own (ConnectDrafter: a torch.distributed pair group at a fresh rendezvous address, or in-band
PutDrafts calls) and joins it. With --register-with it then joins the gateway's drafter pool
itself, and leaves it (and its pairing) when stopped, so replicas can come and go at will;
`membership.py` keeps both memberships alive.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import uuid


from drafter_svc.membership import Pairing, PoolAdmin, keep_paired
from drafter_svc.servicer import DrafterServicer
from minedraft import bundled
from minedraft.constants import DEFAULT_VERIFIER, DRAFTER_PORT
from minedraft.service.flags import add_runner_args, resolve_model, runner_config, service_parser
from minedraft.service.network import advertised_host
from minedraft.service.placement import compute_thread, place_process, resolve_device
from minedraft.service.runtime import add_log_format_arg, end_with_launcher, run
from minedraft.service.security import (DialSecurity, SecurityError, ServerSecurity, add_dial_args,
                                        add_server_args)
from minedraft.service.server import MESSAGE_SIZE_OPTIONS, start_server, wait_healthy
from minedraft.v1 import engine_pb2, engine_pb2_grpc

logger = logging.getLogger("minedraft.drafter")


def build_parser() -> argparse.ArgumentParser:
    parser = service_parser("drafter_svc", "MineDraft drafter: serves the draft model's steps and sends its "
                                           "drafts to the verifier over the data plane")
    add_runner_args(parser, default_model=bundled.DRAFT)
    add_log_format_arg(parser)
    parser.add_argument("--port", type=int, default=DRAFTER_PORT, help="gRPC port to serve on (0: any free port)")
    parser.add_argument("--verifier", default=DEFAULT_VERIFIER, help="the verifier's gRPC HOST:PORT")
    parser.add_argument("--register-with", default="",
                        help="a gateway's admin HOST:PORT (its --admin-port): join its drafter pool once "
                             "serving, rejoin whenever dropped, leave it on stop (default: none)")
    parser.add_argument("--advertise-host", default="",
                        help="host name the gateway reaches this drafter at (default: --host, or this "
                             "machine's address when binding all interfaces; 'auto' = this machine's address)")
    parser.add_argument("--gpu-lock-dir", default="/tmp/minedraft-gpu-locks",
                        help="with --device cuda:auto, where replicas on one host claim their GPU")
    parser.add_argument("--connect-timeout", type=float, default=300.0,
                        help="seconds to wait at start-up for the verifier to serve (the gateway of "
                             "--register-with is waited for as long as it takes)")
    add_server_args(parser, public=False)
    add_dial_args(parser, internal=True)
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.serving = ServerSecurity.from_args(args, internal=True)
        args.dial = DialSecurity.from_args(args, internal=True)
    except SecurityError as err:
        parser.error(str(err))
    return args


def _inband_put(verifier_address: str, drafter_id: str, dial: DialSecurity):
    """A blocking PutDrafts call, made from the drafter's send thread."""
    from minedraft.data_plane import encode_payload

    channel = dial.channel(verifier_address, options=MESSAGE_SIZE_OPTIONS)
    stub = engine_pb2_grpc.VerifierStub(channel)

    def put(payload) -> None:
        stub.PutDrafts(engine_pb2.DraftPayload(drafter_id=drafter_id, **encode_payload(payload)), timeout=60.0)

    return put


def _sender_factory(verifier_address: str, drafter_id: str, device: str, dial: DialSecurity):
    """ConnectDrafterResponse -> the DraftSender for that pairing (blocking: joins the group)."""
    from minedraft.data_plane import DistributedDraftSender, InBandDraftSender, LocalDraftSender

    def open_sender(pairing: engine_pb2.ConnectDrafterResponse):
        if pairing.data_plane == "inband":
            return InBandDraftSender(_inband_put(verifier_address, drafter_id, dial))
        if pairing.data_plane == "unix":
            return LocalDraftSender(pairing.address, pairing.pairing_key)
        host, _, port = pairing.address.rpartition(":")
        return DistributedDraftSender(host, int(port), backend=pairing.data_plane, device=device)

    return open_sender


async def serve(args: argparse.Namespace) -> None:
    from minedraft.drafter import Drafter
    from minedraft.model_runner import ModelRunner

    place_process(args.cpus)
    device, gpu_lock = resolve_device(args.device, args.gpu_lock_dir)
    config = runner_config(args, device=device)
    loop = asyncio.get_running_loop()
    compute = compute_thread("draft")          # the model loads where its steps will run
    drafter = await loop.run_in_executor(compute, lambda: Drafter(ModelRunner(config)))
    drafter_id = uuid.uuid4().hex
    await wait_healthy(args.verifier, args.connect_timeout, args.dial)
    verifier_channel = args.dial.aio_channel(args.verifier)
    pairing = Pairing(engine_pb2_grpc.VerifierStub(verifier_channel), drafter_id,
                      _sender_factory(args.verifier, drafter_id, device, args.dial))
    sender = await pairing.connect()
    servicer = DrafterServicer(drafter, sender, pairing.data_plane, args.model, drafter_id, compute)
    served = await start_server(lambda s: engine_pb2_grpc.add_DrafterServicer_to_server(servicer, s),
                                args.host, args.port, ["minedraft.v1.Drafter"], args.port_file,
                                credentials=args.serving.credentials(), interceptors=args.serving.interceptors())
    address = f"{advertised_host(args.host, args.advertise_host)}:{served.port}"
    logger.info("drafter %s serving %s on %s (%s, data plane %s)", drafter_id[:8], args.model, address,
                device, pairing.data_plane)
    tasks = [asyncio.ensure_future(keep_paired(pairing, servicer))]
    admin = PoolAdmin(args.register_with, args.dial) if args.register_with else None
    if admin is not None:
        await admin.register(address)         # waits for the gateway, however long it takes to come
        tasks.append(asyncio.ensure_future(admin.keep_registered(
            address, lambda: pairing.renew_before_rejoining(servicer), lambda: servicer.dismissed)))
    try:
        done, _ = await asyncio.wait([*tasks, asyncio.ensure_future(served.server.wait_for_termination())],
                                     return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            task.result()               # a keep-alive that ended is a bug: fail loudly
        raise SystemExit("a drafter keep-alive task ended")
    finally:
        for task in tasks:
            task.cancel()
        if admin is not None:
            await admin.leave(address)
            await admin.close()
        await served.server.stop(grace=1.0)
        await pairing.disconnect()
        servicer.sender.close()
        await verifier_channel.close()
        if gpu_lock is not None:
            gpu_lock.close()


def main(argv: list[str] | None = None) -> None:
    end_with_launcher()
    args = parse_args(argv)
    resolve_model(args, "drafter_svc")
    run(lambda: serve(args), args.log_level, args.log_format)


if __name__ == "__main__":
    main()
