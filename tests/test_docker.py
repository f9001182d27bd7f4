"""The Docker deployment, checked without a Docker engine: the compose file resolves, its
profiles are closed, GPUs and ports are where docs/deploy.md says, every command line is one
the services' own parsers accept, the Dockerfiles copy files that exist, and the health
probe the images use really answers 0 / 1."""

from __future__ import annotations

import fnmatch
import importlib
import re
import shlex
import shutil
import subprocess
import sys
from concurrent import futures
from pathlib import Path

import grpc
import pytest
import yaml
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from minedraft.service.network import free_port

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
COMPOSE = DOCKER / "compose.yaml"
DOCKERFILES = [DOCKER / "Dockerfile.cuda", DOCKER / "Dockerfile.cpu"]
DEPLOY_DOC = ROOT / "docs" / "deploy.md"
PROFILES = ("gpu", "cpu")
SERVICE_MODULES = ("verifier_svc", "drafter_svc", "gateway")
VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")


# --- compose -----------------------------------------------------------------------------

def _interpolate(node, seen: dict[str, tuple[str, str]]):
    """Resolve ${VAR:-default} as compose would with nothing set; note each variable."""
    if isinstance(node, dict):
        return {key: _interpolate(value, seen) for key, value in node.items()}
    if isinstance(node, list):
        return [_interpolate(value, seen) for value in node]
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
def variables(raw_compose) -> dict[str, tuple[str, str]]:
    seen: dict[str, tuple[str, str]] = {}
    _interpolate(raw_compose, seen)
    return seen


@pytest.fixture(scope="module")
def services(raw_compose) -> dict[str, dict]:
    return _interpolate(raw_compose, {})["services"]


def _argv(service: dict) -> list[str]:
    command = service["command"]
    return shlex.split(command) if isinstance(command, str) else [str(part) for part in command]


def _module(argv: list[str]) -> str:
    assert argv[:2] == ["python", "-m"], f"expected `python -m MODULE ...`, got {argv[:3]}"
    return argv[2]


def _flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def _active(services: dict[str, dict], profile: str) -> dict[str, dict]:
    return {name: s for name, s in services.items() if not s.get("profiles") or profile in s["profiles"]}


def _by_module(active: dict[str, dict]) -> dict[str, tuple[str, dict]]:
    found: dict[str, tuple[str, dict]] = {}
    for name, service in active.items():
        module = _module(_argv(service))
        assert module not in found, f"{module} runs in both {found[module][0]} and {name}"
        found[module] = (name, service)
    return found


def _gpu_ids(service: dict) -> list[str]:
    devices = service.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
    return [str(i) for device in devices for i in device.get("device_ids", [])]


def test_every_variable_has_a_default_or_is_documented(variables):
    assert variables, "compose.yaml should make model dirs and ports configurable"
    doc = DEPLOY_DOC.read_text()
    for name, (op, _) in variables.items():
        assert op in (":-", "-", ":?", "?"), f"${{{name}}} has neither a default nor a required marker"
        assert name in doc, f"${{{name}}} is not documented in docs/deploy.md"


def test_images_build_from_files_that_exist(services):
    for name, service in services.items():
        assert "image" in service or "build" in service, f"{name}: neither image nor build"
        build = service.get("build")
        if build is None:
            continue
        context = (DOCKER / (build if isinstance(build, str) else build["context"])).resolve()
        assert context.is_dir(), f"{name}: build context {context} is missing"
        dockerfile = context / (build.get("dockerfile", "Dockerfile") if isinstance(build, dict) else "Dockerfile")
        assert dockerfile.is_file(), f"{name}: {dockerfile} is missing"


def test_every_service_is_in_one_profile(services):
    # So `--profile cpu` never also starts the GPU stack (profile-less services always start).
    for name, service in services.items():
        profiles = service.get("profiles", [])
        assert len(profiles) == 1 and profiles[0] in PROFILES, f"{name}: profiles {profiles}"


@pytest.mark.parametrize("profile", PROFILES)
def test_profile_is_a_closed_stack(services, profile):
    active = _active(services, profile)
    assert set(_by_module(active)) == set(SERVICE_MODULES), f"{profile}: not one of each service"
    for name, service in active.items():
        for target, rule in service.get("depends_on", {}).items():
            assert target in active, f"{profile}: {name} depends on {target}, which is not in the profile"
            assert rule["condition"] == "service_healthy", f"{name} -> {target}"
            assert "healthcheck" in services[target], f"{name} waits for {target}, which has no healthcheck"


@pytest.mark.parametrize("profile", PROFILES)
def test_commands_point_at_their_peers(services, profile):
    """--verifier / --register-with name a service of the same profile, on the port it serves."""
    by_module = _by_module(_active(services, profile))
    ports = {name: _flag(_argv(s), "--port") for name, s in by_module.values()}
    verifier_name, _ = by_module["verifier_svc"]
    gateway_name, _ = by_module["gateway"]
    expected = {"--verifier": f"{verifier_name}:{ports[verifier_name]}",
                "--register-with": f"{gateway_name}:{ports[gateway_name]}"}
    for module in ("drafter_svc", "gateway"):
        argv = _argv(by_module[module][1])
        assert _flag(argv, "--verifier") == expected["--verifier"], f"{module} in {profile}"
    assert _flag(_argv(by_module["drafter_svc"][1]), "--register-with") == expected["--register-with"]
    assert _flag(_argv(by_module["verifier_svc"][1]), "--advertise-host") == verifier_name


def test_healthchecks_probe_each_service_own_port(services):
    for name, service in services.items():
        test = service["healthcheck"]["test"]
        assert test[:4] == ["CMD", "python", "-m", "minedraft.healthcheck"], f"{name}: {test}"
        assert test[4] == f"127.0.0.1:{_flag(_argv(service), '--port')}", f"{name}: {test}"


def test_published_ports_are_unique(services):
    published = [str(port).rsplit(":", 1)[0] for s in services.values() for port in s.get("ports", [])]
    assert published and len(published) == len(set(published)), published
    gateway = services["gateway"]
    assert [str(p) for p in gateway["ports"]] == ["50051:50051"]
    internal = [name for name, s in services.items() if s.get("ports") and _module(_argv(s)) != "gateway"]
    assert not internal, f"only gateways publish ports, not {internal}"


def test_gpu_placement(services):
    assert _gpu_ids(services["verifier"]) == ["0", "1", "2", "3"]
    assert _flag(_argv(services["verifier"]), "--tp") == "4"
    assert _gpu_ids(services["drafter"]) == ["4"]
    assert _flag(_argv(services["drafter"]), "--device") == "cuda:auto"
    for name in _active(services, "cpu"):
        assert not _gpu_ids(services[name]), f"{name} reserves a GPU"
        assert _flag(_argv(services[name]), "--device") in (None, "cpu"), name


def test_gpu_services_share_host_ipc_and_nccl_settings(services):
    for name in ("verifier", "drafter"):
        service = services[name]
        assert service["ipc"] == "host" and service["shm_size"], name
        assert {"NCCL_DEBUG", "NCCL_SOCKET_IFNAME"} <= set(service["environment"]), name


def test_models_are_mounted_read_only(services):
    def mounts(name: str) -> dict[str, dict]:
        return {m["target"]: m for m in services[name].get("volumes", []) if isinstance(m, dict)}

    assert mounts("verifier")["/models/target"]["read_only"] is True
    assert mounts("gateway")["/models/target"]["read_only"] is True
    assert mounts("drafter")["/models/draft"]["read_only"] is True
    for name, service in _active(services, "cpu").items():  # the bundled pair ships in the image
        assert "--model" not in _argv(service) and not service.get("volumes"), name


def test_drafter_replicas_share_one_gpu_lock_volume(raw_compose, services):
    lock_dir = _flag(_argv(services["drafter"]), "--gpu-lock-dir")
    [lock_volume] = [m for m in services["drafter"]["volumes"] if m["target"] == lock_dir]
    assert lock_volume["type"] == "volume" and lock_volume["source"] in raw_compose["volumes"]


@pytest.mark.parametrize("module", SERVICE_MODULES)
def test_service_parsers_accept_compose_flags(services, module, monkeypatch):
    """The exact arguments compose passes are ones the service's own argparse accepts."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)    # as in the containers: no torchrun around
    assert (ROOT / module / "__main__.py").is_file()
    parse_args = importlib.import_module(f"{module}.main").parse_args
    commands = [(name, _argv(s)) for name, s in services.items() if _module(_argv(s)) == module]
    assert len(commands) == len(PROFILES)
    for name, argv in commands:
        try:
            parse_args(argv[3:])
        except SystemExit as error:
            pytest.fail(f"{name}: `{shlex.join(argv)}` rejected by {module}'s parser (exit {error.code})")


@pytest.mark.skipif(shutil.which("docker") is None, reason="no docker CLI")
def test_docker_compose_config_when_available():
    """The real compose parser, where the `docker compose` plugin is installed."""
    if subprocess.run(["docker", "compose", "version"], check=False, capture_output=True).returncode != 0:
        pytest.skip("docker compose plugin not installed")
    for profile in PROFILES:
        result = subprocess.run(["docker", "compose", "-f", str(COMPOSE), "--profile", profile, "config", "-q"],
                                check=False, capture_output=True, text=True, timeout=30)
        assert result.returncode == 0, result.stderr


# --- Dockerfiles -------------------------------------------------------------------------

def _instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    lines = [line for line in path.read_text().splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n\s*", " ", "\n".join(lines))
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line.strip() else "")
            for line in (raw.strip() for raw in joined.splitlines()) if line]


def _dockerignore() -> list[str]:
    path = ROOT / ".dockerignore"
    return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule, closely enough for top-level paths: the last matching pattern wins,
    and a pattern that matches a parent directory matches what lies in it."""
    parts = path.strip("/").split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    ignored = False
    for pattern in patterns:
        negated, pattern = pattern.startswith("!"), pattern.lstrip("!").strip("/")
        if any(fnmatch.fnmatch(prefix, pattern) for prefix in prefixes):
            ignored = not negated
    return ignored


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_copies_files_that_exist_and_are_sent(dockerfile):
    ignore = _dockerignore()
    copies = [args.split() for op, args in _instructions(dockerfile) if op == "COPY"]
    assert copies
    for args in copies:
        if any(arg.startswith("--from=") for arg in args):
            continue
        for source in [arg for arg in args if not arg.startswith("--")][:-1]:
            assert (ROOT / source).exists(), f"{dockerfile.name}: COPY {source} does not exist"
            assert not _ignored(source, ignore), f"{dockerfile.name}: COPY {source} is excluded by .dockerignore"
    for needed in ("pyproject.toml", "README.md", "minedraft/bundled/target/config.json"):
        assert not _ignored(needed, ignore), needed
    for kept_out in (".venv", ".git", "tests", "bench_out", "minedraft/__pycache__"):
        assert _ignored(kept_out, ignore), kept_out


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_is_multistage_pinned_and_non_root(dockerfile):
    steps = _instructions(dockerfile)
    args = dict(a.split("=", 1) for op, a in steps if op == "ARG" and "=" in a)
    assert args.get("TORCH_VERSION") == "2.13.0"
    froms = [a for op, a in steps if op == "FROM"]
    assert len(froms) >= 2 and " AS builder" in froms[0]
    for image in froms:
        name = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image.split()[0])
        tag = name.split("@")[0].rsplit(":", 1)[-1] if ":" in name else ""
        assert re.search(r"\d+\.\d+", tag), f"{dockerfile.name}: base {name} is not pinned to a version"
    runs = " ".join(a for op, a in steps if op == "RUN")
    assert 'torch==${TORCH_VERSION}' in runs and re.search(r"pip install .*\s\.(\s|$)", runs)
    assert any(op == "COPY" and "--from=builder" in a and "/opt/venv" in a for op, a in steps)
    users = [a for op, a in steps if op == "USER"]
    assert users and users[-1] not in ("root", "0")
    health_check = " ".join(a for op, a in steps if op == "HEALTHCHECK")
    assert "python -m minedraft.healthcheck" in health_check
    cmd = [a for op, a in steps if op == "CMD"][-1]
    assert '"minedraft"' in cmd and 'minedraft = "minedraft.cli:main"' in (ROOT / "pyproject.toml").read_text()


def test_cpu_image_takes_torch_from_the_cpu_index():
    args = dict(a.split("=", 1) for op, a in _instructions(DOCKERFILES[1]) if op == "ARG" and "=" in a)
    assert args["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"


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


def _probe(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minedraft.healthcheck", *args], cwd=ROOT,
                          check=False, capture_output=True, text=True, timeout=30)


def test_healthcheck_serving_exits_0(health_server):
    servicer, address = health_server
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    servicer.set("minedraft.v1.Verifier", health_pb2.HealthCheckResponse.SERVING)
    assert _probe(address).returncode == 0
    assert _probe(address, "--service", "minedraft.v1.Verifier", "--timeout", "5").returncode == 0


def test_healthcheck_not_serving_exits_1(health_server):
    servicer, address = health_server
    servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    result = _probe(address)
    assert result.returncode == 1 and "NOT_SERVING" in result.stdout
    assert _probe(address, "--service", "no.such.Service").returncode == 1


def test_healthcheck_without_server_or_with_bad_usage_exits_1():
    address = f"127.0.0.1:{free_port()}"            # a port nothing listens on
    result = _probe(address, "--timeout", "2")
    assert result.returncode == 1 and "UNAVAILABLE" in result.stdout
    assert _probe().returncode == 1          # missing address: 1, never Docker's reserved 2
