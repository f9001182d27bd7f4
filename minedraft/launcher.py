"""`minedraft serve`: the three services on one host, as separate processes.

Picks free ports, places drafter and verifier on disjoint cores, waits until every
service reports healthy, and stops them all on Ctrl-C (or when one of them dies).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

from minedraft import bundled
from minedraft.service import wait_healthy


@dataclass(frozen=True)
class ServeConfig:
    mode: str = "psd"
    k: int = 4
    max_batch: int = 8
    port: int = 50051
    host: str = "127.0.0.1"
    target: str = bundled.TARGET
    draft: str = bundled.DRAFT
    dtype: str = "float32"
    target_device: str = "cpu"
    draft_device: str = "cpu"
    target_threads: int = 1
    draft_threads: int = 1
    target_cpus: str = field(default_factory=lambda: "0" if (os.cpu_count() or 1) > 1 else "")
    draft_cpus: str = field(default_factory=lambda: "1" if (os.cpu_count() or 1) > 1 else "")
    data_plane: str = "gloo"       # gloo | nccl | inband
    num_blocks: int = 4096
    log_level: str = "WARNING"
    startup_timeout_s: float = 300.0
    synthetic_acceptance: float | None = None   # benchmarks only; `minedraft serve` never sets it
    random_weights: bool = False                # benchmarks only: config.json shapes, random weights


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class Cluster:
    """Running services; use as a context manager so they always stop."""

    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.procs: dict[str, subprocess.Popen] = {}
        self.port = config.port or free_port(config.host)

    @property
    def address(self) -> str:
        return f"{self.config.host}:{self.port}"

    def start(self) -> "Cluster":
        cfg = self.config
        py = [sys.executable, "-m"]
        verifier_port, drafter_port = free_port(cfg.host), free_port(cfg.host)
        self.verifier_address = f"{cfg.host}:{verifier_port}"
        self.drafter_address = f"{cfg.host}:{drafter_port}" if cfg.mode != "ar" else None
        plane = cfg.data_plane if cfg.mode != "ar" else "inband"
        common = ["--host", cfg.host, "--dtype", cfg.dtype, "--num-blocks", str(cfg.num_blocks),
                  "--log-level", cfg.log_level] + (["--random-weights"] if cfg.random_weights else [])
        self._spawn("verifier", py + ["verifier_svc", "--model", cfg.target, "--port", str(verifier_port),
                                      "--device", cfg.target_device, "--threads", str(cfg.target_threads),
                                      "--cpus", cfg.target_cpus, "--data-plane", plane,
                                      "--data-plane-port", str(free_port(cfg.host))] + common
                    + ([] if cfg.synthetic_acceptance is None else
                       ["--synthetic-acceptance", str(cfg.synthetic_acceptance), "--benchmark-only"]))
        if cfg.mode != "ar":
            self._spawn("drafter", py + ["drafter_svc", "--model", cfg.draft, "--port", str(drafter_port),
                                         "--device", cfg.draft_device, "--threads", str(cfg.draft_threads),
                                         "--cpus", cfg.draft_cpus, "--verifier", f"{cfg.host}:{verifier_port}"]
                        + common)
        self._spawn("gateway", py + ["gateway", "--host", cfg.host, "--port", str(self.port),
                                     "--verifier", f"{cfg.host}:{verifier_port}",
                                     "--drafter", f"{cfg.host}:{drafter_port}", "--mode", cfg.mode,
                                     "--k", str(cfg.k), "--max-batch", str(cfg.max_batch),
                                     "--log-level", cfg.log_level])
        try:
            asyncio.run(self._wait_ready())
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, name: str, argv: list[str]) -> None:
        self.procs[name] = subprocess.Popen(argv, start_new_session=True)

    async def _wait_ready(self) -> None:
        waiter = asyncio.ensure_future(wait_healthy(self.address, self.config.startup_timeout_s))
        while not waiter.done():
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead:
                waiter.cancel()
                raise RuntimeError(f"{', '.join(dead)} exited during start-up")
            await asyncio.sleep(0.2)
        waiter.result()

    def dead(self) -> list[str]:
        return [n for n, p in self.procs.items() if p.poll() is not None]

    def stop(self, timeout_s: float = 10.0) -> None:
        """Front to back: the gateway first (no new steps), then the drafter, then the
        verifier, whose data-plane receive is still posted until its peer has gone."""
        deadline = time.monotonic() + timeout_s
        for name in ("gateway", "drafter", "verifier"):
            proc = self.procs.get(name)
            if proc is None:
                continue
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def __enter__(self) -> "Cluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def serve_forever(config: ServeConfig) -> int:
    for sig in (signal.SIGINT, signal.SIGTERM):       # also when started with SIGINT ignored
        signal.signal(sig, _interrupt)
    cluster = Cluster(config)
    cluster.start()
    print(f"minedraft: {config.mode} (k={config.k}, m={config.max_batch}) serving on {cluster.address}; "
          f"Ctrl-C stops all services", flush=True)
    try:
        while not cluster.dead():
            time.sleep(0.5)
        print(f"minedraft: {', '.join(cluster.dead())} exited; stopping", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)     # a second Ctrl-C must not orphan services
        cluster.stop()
        print("minedraft: all services stopped", flush=True)
