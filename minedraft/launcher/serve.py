"""`minedraft serve`: start the services, report them, stop them all on Ctrl-C or when the
gateway or the verifier dies (a drafter that exits only shrinks the pool)."""

from __future__ import annotations

import signal
import sys
import time

from minedraft.launcher.cluster import Cluster
from minedraft.launcher.config import ServeConfig


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def serve_forever(config: ServeConfig) -> int:
    for sig in (signal.SIGINT, signal.SIGTERM):       # also when started with SIGINT ignored
        signal.signal(sig, _interrupt)
    cluster = Cluster(config)
    cluster.start()
    print(f"minedraft: {config.mode} (k={config.k}, m={config.max_batch}, tp={config.tp}, "
          f"drafters={config.drafters if config.mode != 'ar' else 0}) serving on {cluster.address} "
          f"(pool admin on {cluster.admin_address}); "
          f"Ctrl-C stops all services", flush=True)
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
