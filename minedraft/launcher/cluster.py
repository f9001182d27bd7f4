"""The services of one host as child processes: started in order, each naming the port it
bound in a port file (no port is picked ahead and lost to another bind), placed on disjoint
cores, and stopped front to back. Tests drive it too (kill one service, add a drafter)."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from minedraft.launcher.config import ServeConfig
from minedraft.service.backoff import Backoff
from minedraft.service.runtime import LAUNCHER_PID_ENV
from minedraft.service.security import INTERNAL_TOKEN_ENV, DialSecurity, read_token
from minedraft.service.server import wait_healthy


class Cluster:
    """Running services; use as a context manager so they always stop."""

    def __init__(self, config: ServeConfig, report: Callable[[str], None] = lambda message: None) -> None:
        self.config = config
        self.report = report                # told each step of start-up (`minedraft serve` prints them)
        self.procs: dict[str, subprocess.Popen] = {}
        self._killed: set[str] = set()
        self._port_dir: Path | None = None
        self.port = config.port             # the bound one once started (config.port 0: any)
        self.admin_address = ""             # the gateway's drafter-pool admin API
        self.http_url = ""                  # the OpenAI-compatible API's base URL ('' = off), e.g. http://h:8000
        # The model's name on the HTTP API: a directory's name, or the Hugging Face id as given.
        self.model_name = Path(config.target).name if Path(config.target).is_dir() else config.target
        self.metrics_url = ""               # the gateway's Prometheus metrics ('' = off)
        self.verifier_address = ""
        self.drafter_addresses: list[str] = []
        self._common = ["--host", config.host, "--dtype", config.dtype, "--num-blocks", str(config.num_blocks),
                        "--log-level", config.log_level, "--log-format", config.log_format] + (
                           ["--random-weights"] if config.random_weights else [])

    @property
    def address(self) -> str:
        return f"{self.config.host}:{self.port}"

    def start(self) -> "Cluster":
        """Start the verifier, the gateway, then the drafters, which join the gateway's pool
        themselves (as replicas started by an orchestrator do, and rejoin after a restart).
        Each binds a port of its own choosing (or the configured public port) and names it
        in a port file, so no port is picked ahead of time and lost to another bind."""
        cfg = self.config
        self._port_dir = Path(tempfile.mkdtemp(prefix="minedraft-ports-"))
        try:
            self.report(f"starting the verifier: {cfg.target} on {cfg.target_device}"
                        f"{f' (tp {cfg.tp})' if cfg.tp > 1 else ''}, loading the model ...")
            self._spawn_verifier(port=0)
            self.verifier_address = f"{cfg.host}:{self._wait_port('verifier')}"
            self.report(f"verifier ready on {self.verifier_address}")
            admin_port = cfg.admin_port if cfg.port else 0
            # With port 0 the gateway binds the HTTP API on a free port of its own too, and names it.
            http_port = cfg.http_port if cfg.port or not cfg.http_port else "any"
            self.report(f"starting the gateway: mode {cfg.mode}{f', k {cfg.k}' if cfg.mode != 'ar' else ''}, "
                        f"max batch {cfg.max_batch} ...")
            self._spawn("gateway", ["gateway", "--host", cfg.host, "--port", str(cfg.port),
                                    "--admin-port", str(admin_port), *(["--insecure"] if cfg.insecure else []),
                                    "--verifier", self.verifier_address, "--mode", cfg.mode,
                                    *(["--tokenizer-revision", cfg.target_revision] if cfg.target_revision else []),
                                    "--k", str(cfg.k), "--max-batch", str(cfg.max_batch),
                                    "--step-timeout", str(cfg.step_timeout_s), "--max-waiting", str(cfg.max_waiting),
                                    *(["--auto-cycle-steps", str(cfg.auto_cycle_steps)]
                                      if cfg.auto_cycle_steps else []),
                                    "--metrics-port", str(cfg.metrics_port),
                                    "--http-port", str(http_port), "--served-model-name", self.model_name,
                                    "--log-level", cfg.log_level, "--log-format", cfg.log_format])
            self.port = self._wait_port("gateway")
            self.admin_address = f"127.0.0.1:{self._wait_port('gateway.admin', process='gateway')}"
            if http_port:
                host = f"[{cfg.host}]" if ":" in cfg.host else cfg.host
                self.http_url = f"http://{host}:{self._wait_port('gateway.http', process='gateway')}"
            asyncio.run(self._wait_ready(self.address))
            if cfg.metrics_port:
                host = f"[{cfg.host}]" if ":" in cfg.host else cfg.host
                self.metrics_url = f"http://{host}:{cfg.metrics_port}/metrics"
                self.report(f"Prometheus metrics at {self.metrics_url} (docs/metrics.md)")
            self.report(f"gateway ready: gRPC on {self.address}"
                        f"{f', OpenAI-compatible HTTP on {self.http_url}/v1' if self.http_url else ''}, "
                        f"pool admin on {self.admin_address}")
            for _ in range(cfg.drafters if cfg.mode != "ar" else 0):
                self.add_drafter()
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn_verifier(self, port: int) -> None:
        self._spawn("verifier", self.verifier_args(port))

    def verifier_args(self, port: int) -> list[str]:
        """`python -m` arguments of the verifier; only ar mode has no drafts to carry."""
        cfg = self.config
        plane = cfg.data_plane if cfg.mode != "ar" else "inband"
        return (["verifier_svc", "--model", cfg.target, *_revision(cfg.target_revision), "--port", str(port),
                 "--device", cfg.target_device, "--threads", str(cfg.target_threads),
                 "--cpus", cfg.target_cpus, "--data-plane", plane, "--tp", str(cfg.tp)]
                + (["--borrow-cpus", cfg.lent_cpus] if cfg.lent_cpus else [])
                + self._common
                + ([] if cfg.synthetic_acceptance is None else
                   ["--synthetic-acceptance", *map(str, cfg.synthetic_acceptance), "--benchmark-only"]))

    def _spawn_drafter(self, name: str | None = None) -> str:
        """Start a drafter that joins the gateway's pool itself; -> its process name."""
        cfg = self.config
        name = name or f"drafter-{sum(n.startswith('drafter') for n in self.procs)}"
        self._spawn(name, ["drafter_svc", "--model", cfg.draft, *_revision(cfg.draft_revision), "--port", "0",
                           "--device", cfg.draft_device, "--threads", str(cfg.draft_threads),
                           "--cpus", cfg.draft_cpus, "--verifier", self.verifier_address,
                           "--register-with", self.admin_address] + self._common)
        return name

    def add_drafter(self, name: str | None = None) -> tuple[str, str]:
        """A drafter joining the running pool (a new one, or `name` started again); returns
        once the gateway lists it. -> (process name, address)."""
        name = self._spawn_drafter(name)
        self.report(f"starting {name}: {self.config.draft} on {self.config.draft_device} ...")
        address = f"{self.config.host}:{self._wait_port(name)}"
        asyncio.run(self._wait_listed(address))
        self.report(f"{name} ready on {address}, in the gateway's pool")
        if address not in self.drafter_addresses:
            self.drafter_addresses.append(address)
        return name, address

    def restart_verifier(self) -> None:
        """Start the verifier again on its old port (after `kill`); returns once it serves."""
        self._spawn_verifier(port=int(self.verifier_address.rpartition(":")[2]))
        self._wait_port("verifier")
        asyncio.run(wait_healthy(self.verifier_address, self.config.startup_timeout_s))

    def send_signal(self, name: str, sig: int) -> None:
        """Send one service a signal (SIGSTOP / SIGCONT / SIGTERM in failure tests)."""
        self.procs[name].send_signal(sig)

    def _wait_port(self, name: str, process: str | None = None) -> int:
        """The port in port file `name` (written by `process`, default the same name); fails
        fast if the process died."""
        path = self._port_dir / name
        deadline = time.monotonic() + self.config.startup_timeout_s
        while not path.exists():
            if self.procs[process or name].poll() is not None:
                raise RuntimeError(f"{process or name} exited during start-up")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} did not start serving within {self.config.startup_timeout_s:.0f} s")
            time.sleep(0.05)
        return int(path.read_text())

    async def _wait_listed(self, address: str) -> None:
        from minedraft.v1 import generation_pb2, generation_pb2_grpc

        deadline = time.monotonic() + self.config.startup_timeout_s
        # The admin API takes the deployment's internal token (inherited by the services too).
        dial = DialSecurity(token=read_token("", INTERNAL_TOKEN_ENV, "--internal-token-file"))
        async with dial.aio_channel(self.admin_address) as channel:
            stub = generation_pb2_grpc.DrafterPoolStub(channel)
            delays = Backoff(initial_s=0.05, max_s=1.0).delays()        # the pool has no stream to watch
            while time.monotonic() < deadline:
                status = await stub.List(generation_pb2.ListDraftersRequest(), timeout=10.0, wait_for_ready=True)
                if any(d.address == address for d in status.drafters):
                    return
                if self.dead():
                    raise RuntimeError(f"{', '.join(self.dead())} exited while a drafter joined")
                await asyncio.sleep(next(delays))
        raise TimeoutError(f"drafter {address} did not join the pool")

    def kill(self, name: str, sig: int = signal.SIGKILL, timeout_s: float = 30.0) -> int:
        """End one service process with `sig` (failure tests; SIGTERM lets it leave as a
        scaled-down replica does) and wait for it; -> its exit code."""
        proc = self.procs[name]
        self._killed.add(name)
        proc.send_signal(sig)
        return proc.wait(timeout_s)

    def _spawn(self, name: str, argv: list[str]) -> None:
        """python -m <argv>, in its own session (a Ctrl-C at the terminal reaches only us)."""
        port_file = self._port_dir / name
        port_file.unlink(missing_ok=True)           # a restarted service writes it anew
        self._killed.discard(name)
        argv = [sys.executable, "-m", *argv, "--port-file", str(port_file)]
        # No preexec_fn: the child ties its end to ours itself (runtime.end_with_launcher).
        self.procs[name] = subprocess.Popen(argv, start_new_session=True,
                                            env={**os.environ, LAUNCHER_PID_ENV: str(os.getpid())})

    async def _wait_ready(self, address: str) -> None:
        waiter = asyncio.ensure_future(wait_healthy(address, self.config.startup_timeout_s))
        while not waiter.done():
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead:
                waiter.cancel()
                raise RuntimeError(f"{', '.join(dead)} exited during start-up")
            await asyncio.sleep(0.2)
        waiter.result()

    def dead(self) -> list[str]:
        return [n for n, p in self.procs.items() if p.poll() is not None and n not in self._killed]

    def stop(self, timeout_s: float = 10.0) -> None:
        """The drafters first (each leaves the gateway's pool, as a scaled-down replica does),
        then the gateway (it drains what is in flight), then the verifier, whose data-plane
        receives stay posted until its peers have gone."""
        deadline = time.monotonic() + timeout_s
        order = ([n for n in self.procs if n.startswith("drafter")] + ["gateway", "verifier"])
        for name in order:
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
        if self._port_dir is not None:
            shutil.rmtree(self._port_dir, ignore_errors=True)

    def __enter__(self) -> "Cluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _revision(revision: str) -> list[str]:
    return ["--revision", revision] if revision else []
