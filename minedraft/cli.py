"""The `minedraft` command."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import TYPE_CHECKING

from minedraft import __version__
from minedraft.constants import DATA_PLANES, DEFAULT_ADMIN, DEFAULT_GATEWAY, DTYPES, MODES
from minedraft.help_format import ArgumentParser
from minedraft.service.runtime import LOG_FORMATS
from minedraft.service.security import DialSecurity, SecurityError, add_dial_args
from minedraft.tables import text_table

if TYPE_CHECKING:
    from minedraft.client import Client, DrafterInfo


def _serve(args: argparse.Namespace) -> int:
    from minedraft.launcher import ServeConfig, serve_forever

    config = ServeConfig(
        mode=args.mode, k=args.k, max_batch=args.max_batch, port=args.port, host=args.host,
        target=args.target, draft=args.draft, target_revision=args.target_revision,
        draft_revision=args.draft_revision, dtype=args.dtype, target_device=args.target_device,
        draft_device=args.draft_device, target_threads=args.target_threads,
        draft_threads=args.draft_threads, target_cpus=args.target_cpus, draft_cpus=args.draft_cpus,
        data_plane=args.data_plane, num_blocks=args.num_blocks, log_level=args.log_level,
        tp=args.tp, drafters=args.drafters, admin_port=args.admin_port, insecure=args.insecure,
        http_port=args.http_port,
        metrics_port=args.metrics_port, log_format=args.log_format)
    return serve_forever(config)


def _client(args: argparse.Namespace) -> Client:
    """A client for --server with add_dial_args' TLS flags and API key (file or environment)."""
    from minedraft.client import Client

    dial = DialSecurity.from_args(args)
    return Client(args.server, timeout=args.timeout, tls_ca=dial.ca_file,
                  tls_client_cert=dial.client_cert_file, tls_client_key=dial.client_key_file,
                  api_key=dial.token)


def _speculation(value: str) -> str | int:
    """--speculation's value as SamplingOptions takes it ("auto", "off" or a draft length N),
    checked by SamplingOptions itself so the CLI and the SDK refuse the same values."""
    from minedraft.client import SamplingOptions

    speculation = int(value) if value.isascii() and value.isdigit() else value
    try:
        return SamplingOptions(speculation=speculation).speculation
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _generate(args: argparse.Namespace) -> int:
    import dataclasses
    import json

    from minedraft.client import MineDraftError, SamplingOptions

    options = SamplingOptions(max_tokens=args.max_tokens, temperature=args.temperature,
                              top_p=args.top_p, top_k=args.top_k, seed=args.seed, stop=args.stop,
                              ignore_eos=args.ignore_eos, speculation=args.speculation)
    try:
        with _client(args) as client:
            if not args.stream:
                result = dataclasses.asdict(client.generate(args.prompt, options))
            else:
                result = dict(text="", token_ids=[], finish_reason=None, request_id="",
                              prompt_tokens=0, stats=None)
                for chunk in client.stream(args.prompt, options):
                    if not args.json:  # show text as it arrives
                        print(chunk.text, end="", flush=True)
                    result["text"] += chunk.text
                    result["token_ids"] += chunk.token_ids
                    result["request_id"] = chunk.request_id or result["request_id"]
                    result["prompt_tokens"] = chunk.prompt_tokens or result["prompt_tokens"]
                    if chunk.finish_reason is not None:
                        result["finish_reason"] = chunk.finish_reason
                        result["stats"] = chunk.stats and dataclasses.asdict(chunk.stats)
    except MineDraftError as error:
        print(f"error: {error.code.name}: {error.message}", file=sys.stderr)
        return 1
    except SecurityError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result))
    elif args.stream:
        print()
    else:
        print(result["text"])
    return 0


def _drafters_table(drafters: list[DrafterInfo]) -> str:
    """Address, id prefix, requests, reserved/total KV blocks and requests ever assigned."""
    if not drafters:
        return "no drafters in the pool"
    header = ("ADDRESS", "ID", "REQUESTS", "BLOCKS", "ASSIGNED")
    rows = [(d.address, d.drafter_id[:8], str(d.num_requests),
             f"{d.reserved_blocks}/{d.num_blocks}", str(d.requests_assigned)) for d in drafters]
    return "\n".join(text_table([header, *rows], left=2))      # address and id left, numbers right


def _drafters(args: argparse.Namespace) -> int:
    import dataclasses
    import json

    from minedraft.client import MineDraftError

    try:
        with _client(args) as client:
            if args.action == "add":
                drafters = client.register_drafter(args.address)
            elif args.action == "remove":
                drafters = client.deregister_drafter(args.address)
            else:
                drafters = client.drafters()
    except MineDraftError as error:
        print(f"error: {error.code.name}: {error.message}", file=sys.stderr)
        return 1
    except SecurityError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"drafters": [dataclasses.asdict(d) for d in drafters]}))
        return 0
    if args.action != "list":
        done = "registered" if args.action == "add" else "deregistered"
        print(f"{done} {args.address}; the pool has {len(drafters)} drafter(s)")
    print(_drafters_table(drafters))
    return 0


def _add_drafters_parser(sub: argparse._SubParsersAction) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--server", default=DEFAULT_ADMIN,
                        help="the gateway's pool admin address, HOST:PORT (its --admin-port)")
    common.add_argument("--timeout", type=float, default=60.0, help="seconds")
    common.add_argument("--json", action="store_true", help="print the pool as one JSON object")
    add_dial_args(common, internal=False)
    drafters = sub.add_parser("drafters", help="list, add or remove drafters in a gateway's pool")
    actions = drafters.add_subparsers(dest="action", required=True)
    actions.add_parser("list", parents=[common], help="show the pool")
    add = actions.add_parser("add", parents=[common], help="register a running drafter")
    add.add_argument("address", help="the drafter's gRPC address, HOST:PORT")
    remove = actions.add_parser("remove", parents=[common],
                                help="deregister a drafter; its requests move to the others")
    remove.add_argument("address", help="the drafter's gRPC address, HOST:PORT")
    drafters.set_defaults(func=_drafters)


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="minedraft", description="LLM serving with batch-parallel speculative decoding")
    parser.add_argument("--version", action="version", version=f"minedraft {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)    # each subcommand's help shows defaults too
    from minedraft import demo as demo_cmd
    from minedraft.bench import main as bench_cmd
    from minedraft.launcher import ServeConfig

    demo_cmd.add_parser(sub)
    bench_cmd.add_parser(sub)
    defaults = ServeConfig()
    serve = sub.add_parser("serve", help="start gateway, verifier and drafter on this host")
    serve.add_argument("--mode", default=defaults.mode, choices=MODES,
                       help="auto: layout and each request's draft length chosen at every step from measured "
                            "costs; ar, sd, psd: fixed, for experiments and baselines")
    serve.add_argument("--k", type=int, default=defaults.k, help="draft length (auto: the longest draft)")
    serve.add_argument("--max-batch", type=int, default=defaults.max_batch,
                       help="requests running at once (auto; split over two batches when they overlap); "
                            "requests per batch in the fixed modes")
    serve.add_argument("--port", type=int, default=defaults.port, help="public gRPC port (0: any free port)")
    serve.add_argument("--http-port", type=int, default=defaults.http_port,
                       help="the OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions, /v1/models, "
                            "/health, /metrics) on --host (0: off); see docs/http.md")
    serve.add_argument("--host", default="127.0.0.1", help="bind address of every service's API")
    serve.add_argument("--admin-port", type=int, default=defaults.admin_port,
                       help="the drafter-pool admin API's port, on 127.0.0.1 only")
    serve.add_argument("--insecure", action="store_true",
                       help="serve a non-loopback --host with neither TLS nor API keys "
                            "(set MINEDRAFT_API_KEYS to require keys instead)")
    serve.add_argument("--target", default=defaults.target, help="target model: a directory or a Hugging Face id")
    serve.add_argument("--draft", default=defaults.draft, help="draft model: a directory or a Hugging Face id")
    serve.add_argument("--target-revision", default="", help="branch, tag or commit of a Hugging Face --target")
    serve.add_argument("--draft-revision", default="", help="branch, tag or commit of a Hugging Face --draft")
    serve.add_argument("--dtype", default=defaults.dtype, choices=DTYPES, help="weights and activations of both models")
    serve.add_argument("--target-device", default=defaults.target_device, help="the verifier's device: cpu, cuda or "
                       "cuda:N (with --tp N > 1, cuda puts rank r on GPU r)")
    serve.add_argument("--draft-device", default=defaults.draft_device,
                       help="the drafters' device: cpu, cuda or cuda:N")
    serve.add_argument("--target-threads", type=int, default=defaults.target_threads,
                       help="torch CPU threads of the verifier")
    serve.add_argument("--draft-threads", type=int, default=defaults.draft_threads,
                       help="torch CPU threads of each drafter")
    serve.add_argument("--target-cpus", default=defaults.target_cpus,
                       help="cores the verifier is pinned to, e.g. '0' or '2-3' ('': not pinned)")
    serve.add_argument("--draft-cpus", default=defaults.draft_cpus,
                       help="cores the drafters are pinned to ('': not pinned)")
    serve.add_argument("--data-plane", default=defaults.data_plane, choices=DATA_PLANES,
                       help="how drafts travel drafter -> verifier: a Unix domain socket (unix: the processes "
                            "share this host), a torch.distributed pair group (gloo on CPU, nccl on GPU) or in-band "
                            "gRPC")
    serve.add_argument("--tp", type=int, default=defaults.tp, help="verifier tensor-parallel ranks")
    serve.add_argument("--drafters", type=int, default=defaults.drafters, help="drafters in the pool (ar mode: none)")
    serve.add_argument("--num-blocks", type=int, default=defaults.num_blocks, help="KV cache blocks per service")
    serve.add_argument("--log-level", default=defaults.log_level, help="the services' log level: DEBUG, INFO, "
                       "WARNING or ERROR")
    serve.add_argument("--log-format", default=defaults.log_format, choices=LOG_FORMATS,
                       help="text: readable lines; json: one JSON object a line, for log collectors")
    serve.add_argument("--metrics-port", type=int, default=defaults.metrics_port,
                       help="serve the gateway's Prometheus metrics at GET /metrics on this port (0: off)")
    serve.set_defaults(func=_serve)
    gen = sub.add_parser("generate", help="send one prompt to a running gateway")
    gen.add_argument("prompt", help="the text to continue")
    gen.add_argument("--server", default=DEFAULT_GATEWAY, help="gateway address, HOST:PORT")
    gen.add_argument("--max-tokens", type=int, default=64, help="tokens to generate at most")
    gen.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    gen.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling (1: off)")
    gen.add_argument("--top-k", type=int, default=0, help="sample from the k likeliest tokens (0: off)")
    gen.add_argument("--seed", type=int, default=None, help="makes sampled output reproducible (none: random)")
    gen.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    gen.add_argument("--ignore-eos", action="store_true", help="go on past the end-of-sequence token")
    gen.add_argument("--speculation", type=_speculation, default="auto", metavar="auto|off|N",
                     help="auto: the server decides; off: no drafts; N: at most N draft tokens a step")
    gen.add_argument("--timeout", type=float, default=60.0, help="seconds")
    gen.add_argument("--json", action="store_true", help="print the whole result as one JSON object")
    gen.add_argument("--stream", action="store_true", help="stream the completion as it is generated")
    add_dial_args(gen, internal=False)
    gen.set_defaults(func=_generate)
    _add_drafters_parser(sub)
    return parser


def _terminated(signum, frame) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # SIGTERM (a supervisor, `kill`, a CI timeout) unwinds as Ctrl-C does, so the services a
    # command started (bench, demo) stop on the way out instead of outliving it.
    main_thread = threading.current_thread() is threading.main_thread()    # (tests call main too)
    previous = signal.signal(signal.SIGTERM, _terminated) if main_thread else None
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print(f"minedraft {args.command}: interrupted", file=sys.stderr)
        return 130
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
