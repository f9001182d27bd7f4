"""`minedraft serve`: start the services, report them, stop them all on Ctrl-C or when the
gateway or the verifier dies (a drafter that exits only shrinks the pool)."""

from __future__ import annotations

import os
import signal
import sys
import time

from minedraft.launcher.cluster import Cluster
from minedraft.launcher.config import ServeConfig
from minedraft.launcher.examples import curl_example, generate_example
from minedraft.service.security import API_KEYS_ENV


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _print_examples(cluster: Cluster) -> None:
    """What to try now: the gRPC API through the CLI and, when on, the HTTP API through curl."""
    print(f"minedraft: try  {generate_example(cluster.address)}", flush=True)
    if cluster.http_url:
        with_key = bool(os.environ.get(API_KEYS_ENV))
        print(f"minedraft: OpenAI-compatible API at {cluster.http_url}/v1 (docs/http.md); try\n"
              f"  {curl_example(cluster.http_url, cluster.model_name, with_key)}", flush=True)


def serve_forever(config: ServeConfig) -> int:
    for sig in (signal.SIGINT, signal.SIGTERM):       # also when started with SIGINT ignored
        signal.signal(sig, _interrupt)
    cluster = Cluster(config, report=lambda message: print(f"minedraft: {message}", flush=True))
    cluster.start()
    print(f"minedraft: {config.mode} (k={config.k}, m={config.max_batch}, tp={config.tp}, "
          f"drafters={config.drafters if config.mode != 'ar' else 0}) serving on {cluster.address} "
          f"(pool admin on {cluster.admin_address}); Ctrl-C stops all services", flush=True)
    _print_examples(cluster)
    try:
        reported: set[str] = set()
        while True:
            dead = cluster.dead()
            if "gateway" in dead or "verifier" in dead:
                break
            for name in set(dead) - reported:       # the pool carries on without it
                print(f"minedraft: {name} exited; its requests moved to the other drafters", file=sys.stderr)
                reported.add(name)
            time.sleep(0.5)
        print(f"minedraft: {', '.join(cluster.dead())} exited; stopping", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)     # a second Ctrl-C must not orphan services
        cluster.stop()
        print("minedraft: all services stopped", flush=True)
