"""What the Docker deployment tests share: the compose file as compose and the services' own
parsers read it, the Dockerfiles' instructions, and the image health probe run for real.

Test modules load it with ``pytest_plugins = ["docker_helpers"]`` for its fixtures
(`raw_compose`, `services`, `commands`, `health_server`); each module still gets its own.
They also import its names first, so pytest cannot rewrite its asserts: PYTEST_DONT_REWRITE.
"""

from __future__ import annotations

import argparse
import importlib
import re
import shlex
import subprocess
import sys
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import yaml
from grpc_health.v1 import health, health_pb2_grpc

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
COMPOSE = DOCKER / "compose.yaml"
PROFILES = ("gpu", "cpu")            # the stacks: each a closed set of MineDraft services
MONITORING = "monitoring"            # an add-on to either stack: Prometheus and Grafana
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")


# --- compose -----------------------------------------------------------------------------

def interpolate(node, seen: dict[str, tuple[str, str]]):
    """Resolve ${VAR:-default} as compose would with nothing set; note each variable."""
    if isinstance(node, dict):
        return {key: interpolate(value, seen) for key, value in node.items()}
    if isinstance(node, list):
        return [interpolate(value, seen) for value in node]
    if isinstance(node, str):
        def resolve(match: re.Match) -> str:
            name, op, arg = match.group(1), match.group(2) or "", match.group(3) or ""
            seen[name] = (op, arg)
            return arg if op.endswith("-") else ""
        return VARIABLE.sub(resolve, node)
    return node


@pytest.fixture(scope="module")
def raw_compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def services(raw_compose) -> dict[str, dict]:
    return interpolate(raw_compose, {})["services"]


def argv_of(service: dict) -> list[str]:
    command = service["command"]
    return shlex.split(command) if isinstance(command, str) else [str(part) for part in command]


def module_of(argv: list[str]) -> str:
    assert argv[:2] == ["python", "-m"], f"expected `python -m MODULE ...`, got {argv[:3]}"
    return argv[2]


def in_profile(services: dict[str, dict], profile: str) -> dict[str, dict]:
    return {name: s for name, s in services.items() if not s.get("profiles") or profile in s["profiles"]}


def stack_services(services: dict[str, dict]) -> dict[str, dict]:
    """The MineDraft services (`python -m ...`), without the monitoring add-on's."""
    return {name: s for name, s in services.items() if MONITORING not in s.get("profiles", [])}


@dataclass(frozen=True)
class Command:
    """A compose service's command as its own service parses it."""
    module: str
    args: argparse.Namespace


@pytest.fixture(scope="module")
def commands(services) -> dict[str, Command]:
    parsed = {}
    with pytest.MonkeyPatch.context() as env:
        for name in TORCHRUN_ENV:
            env.delenv(name, raising=False)       # as in the containers: no torchrun around
        for name, service in stack_services(services).items():
            argv = argv_of(service)
            module = module_of(argv)
            try:
                parsed[name] = Command(module, importlib.import_module(f"{module}.main").parse_args(argv[3:]))
            except SystemExit:
                pytest.fail(f"{name}: `{shlex.join(argv)}` is rejected by {module}'s parser")
    return parsed


def split_address(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    return host, int(port)


# --- Dockerfiles -------------------------------------------------------------------------

def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    lines = [line for line in path.read_text().splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n\s*", " ", "\n".join(lines))
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line.strip() else "")
            for line in (raw.strip() for raw in joined.splitlines()) if line]


# --- minedraft.healthcheck, for real ------------------------------------------------------

@pytest.fixture
def health_server():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    server.stop(grace=None)


def run_probe(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minedraft.healthcheck", *args], cwd=ROOT,
                          check=False, capture_output=True, text=True, timeout=30)
