"""The Docker deployment, checked without a Docker engine, for what would break it: the compose
file resolves and its profiles are closed; every command line is one the services' own parsers
accept; each service reaches its peers by the service names and ports they serve on; the
healthchecks probe each service's own port and run; GPU reservations fit the devices the
commands use; models are mounted where the commands read them; the Dockerfiles copy files that
exist; and the health probe the images use really answers 0 / 1."""

from __future__ import annotations

import argparse
import fnmatch
import importlib
import json
import re
import shlex
import shutil
import subprocess
import sys
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import yaml
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from minedraft import bundled
from minedraft.service.network import free_port

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
COMPOSE = DOCKER / "compose.yaml"
DOCKERFILES = [DOCKER / "Dockerfile.cuda", DOCKER / "Dockerfile.cpu"]
DEPLOY_DOC = ROOT / "docs" / "deploy.md"
BUNDLED = Path(bundled.__file__).parent        # the bundled model pair: inside the package, in every image
PROFILES = ("gpu", "cpu")
SERVICE_MODULES = ("verifier_svc", "drafter_svc", "gateway")
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
WILDCARD_HOSTS = ("0.0.0.0", "::", "[::]")
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")
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


def _active(services: dict[str, dict], profile: str) -> dict[str, dict]:
    return {name: s for name, s in services.items() if not s.get("profiles") or profile in s["profiles"]}


def _by_module(active: dict[str, dict]) -> dict[str, tuple[str, dict]]:
    found: dict[str, tuple[str, dict]] = {}
    for name, service in active.items():
        module = _module(_argv(service))
        assert module not in found, f"{module} runs in both {found[module][0]} and {name}"
        found[module] = (name, service)
    return found


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
        for name, service in services.items():
            argv = _argv(service)
            module = _module(argv)
            try:
                parsed[name] = Command(module, importlib.import_module(f"{module}.main").parse_args(argv[3:]))
            except SystemExit:
                pytest.fail(f"{name}: `{shlex.join(argv)}` is rejected by {module}'s parser")
    return parsed


def _address(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    return host, int(port)


def _published(port: str | int | dict) -> tuple[str, int]:
    """-> ([IP:]HOST_PORT, CONTAINER_PORT) of a `ports:` entry, short or long syntax."""
    if isinstance(port, dict):
        return str(port.get("published", "")), int(port["target"])
    host_side, _, container_port = str(port).rpartition(":")
    return host_side, int(container_port.split("/")[0])


def _gpu_reservations(service: dict) -> list[dict]:
    devices = service.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
    return [device for device in devices if "gpu" in device.get("capabilities", [])]


def _gpu_ids(service: dict) -> list[str]:
    return [str(i) for device in _gpu_reservations(service) for i in device.get("device_ids", [])]


def _gpu_count(service: dict) -> int:
    """GPUs the container sees: they are numbered 0 .. count - 1 inside it."""
    count = 0
    for device in _gpu_reservations(service):
        if "device_ids" in device:
            count += len(device["device_ids"])
        else:
            assert isinstance(device.get("count"), int), f"reserve a known number of GPUs, not {device}"
            count += device["count"]
    return count


def _cuda_indices(command: Command) -> list[int | None]:
    """The GPU index, inside the container, of each process that puts a model on a GPU (the
    verifier's ranks as `rank_device` places them); None: any one (cuda:auto)."""
    from verifier_svc.main import rank_device

    args = command.args
    if command.module == "verifier_svc":
        devices = [rank_device(args.device, rank, args.tp)[0] for rank in range(args.tp)]
    else:
        devices = [getattr(args, "device", "cpu")]
    indices: list[int | None] = []
    for device in devices:
        if device.startswith("cuda"):
            index = device.partition(":")[2] or "0"
            indices.append(int(index) if index.isdigit() else None)
    return indices


def _mounts(service: dict) -> list[dict]:
    """Volumes in long syntax; short `SOURCE:TARGET[:MODE]` entries are converted."""
    mounts = []
    for volume in service.get("volumes", []):
        if isinstance(volume, dict):
            mounts.append(volume)
        else:
            source, target, *mode = str(volume).split(":")
            kind = "bind" if source.startswith((".", "/", "~")) else "volume"
            mounts.append({"type": kind, "source": source, "target": target, "read_only": mode == ["ro"]})
    return mounts


def _mount_over(service: dict, path: str) -> dict | None:
    """The volume mounted at `path` or at the nearest directory above it."""
    covering = [m for m in _mounts(service) if Path(path).is_relative_to(m["target"])]
    return max(covering, key=lambda m: len(m["target"]), default=None)


def _model_dir(commands: dict[str, Command], name: str) -> str:
    """The directory a service's process reads a model or tokenizer from."""
    command = commands[name]
    if command.module != "gateway":
        return command.args.model
    if command.args.tokenizer:
        return command.args.tokenizer
    verifier_host, _ = _address(command.args.verifier)           # default: the verifier's model dir
    return commands[verifier_host].args.model


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


# What each flag naming a peer dials: (the server it must be, the flags that set that server's
# port and bind address). Drafters register through the gateway's admin API, not its public one.
PEER_FLAGS = {"verifier": ("verifier_svc", "port", "host"), "drafter": ("drafter_svc", "port", "host"),
              "register_with": ("gateway", "admin_port", "admin_host")}


@pytest.mark.parametrize("profile", PROFILES)
def test_peers_are_dialled_by_service_name_and_served_port(services, commands, profile):
    """Every HOST:PORT a command dials names a service of the same profile that runs the
    expected server, serving that API on that port and on every interface (a peer in another
    container cannot reach a loopback-only server)."""
    active = _active(services, profile)
    dialled = 0
    for name in active:
        for flag, (server, port_flag, host_flag) in PEER_FLAGS.items():
            values = getattr(commands[name].args, flag, None) or []
            for value in [values] if isinstance(values, str) else values:
                host, port = _address(value)
                assert host in active, f"{name}: --{flag} {value} names no service of the {profile} profile"
                peer = commands[host]
                assert peer.module == server, f"{name}: --{flag} {value} is a {peer.module}"
                served_port, bound = getattr(peer.args, port_flag), getattr(peer.args, host_flag)
                assert port == served_port, f"{name}: --{flag} {value}, but {host} serves it on {served_port}"
                assert bound in WILDCARD_HOSTS, f"{name}: --{flag} {value}, but {host} binds it to {bound} only"
                exposed = [str(exposed_port) for exposed_port in active[host].get("expose", [])]
                assert not exposed or str(port) in exposed, f"{name}: --{flag} {value}, but {host} exposes {exposed}"
                dialled += 1
    assert dialled >= 3, f"{profile}: gateway and drafter should name the verifier, the drafter the gateway"


@pytest.mark.parametrize("profile", PROFILES)
def test_advertised_hosts_reach_the_container_that_advertises_them(services, commands, profile):
    """Verifier and drafters hand peers their own address (the data plane, the pool): it must
    be this service's name or the container's own address; a drafter's must be the container's,
    since `--scale drafter=N` gives N replicas one service name."""
    for name in _active(services, profile):
        command = commands[name]
        if command.module == "gateway":
            continue
        advertise = command.args.advertise_host
        own_address = advertise == "auto" or (not advertise and command.args.host in WILDCARD_HOSTS)
        if command.module == "drafter_svc":
            assert own_address, f"{name}: replicas would all advertise {advertise or command.args.host}"
        else:
            assert own_address or advertise == name, f"{name} advertises {advertise}"


@pytest.mark.parametrize("profile", PROFILES)
def test_healthchecks_probe_the_port_each_service_serves(services, commands, health_server, profile):
    """Each healthcheck runs the image's probe against the container's own serving port, and
    its arguments, run for real against a health server, give 0 for SERVING."""
    servicer, address = health_server
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    for name, service in _active(services, profile).items():
        test = service["healthcheck"]["test"]
        assert test[:4] == ["CMD", "python", "-m", "minedraft.healthcheck"], f"{name}: {test}"
        host, port = _address(test[4])
        assert host in LOOPBACK_HOSTS and port == commands[name].args.port, f"{name}: {test}"
        service_name = test[test.index("--service") + 1] if "--service" in test else ""
        servicer.set(service_name, health_pb2.HealthCheckResponse.SERVING)
        result = _probe(address, *test[5:])
        assert result.returncode == 0, f"{name}: {test[5:]}: {result.stdout}{result.stderr}"


def test_only_gateways_publish_a_port_each_and_it_is_the_served_one(services, commands):
    published = []
    for name, service in services.items():
        for port in service.get("ports", []):
            host_side, container_port = _published(port)
            assert commands[name].module == "gateway", f"only gateways publish ports, not {name}"
            assert container_port == commands[name].args.port, f"{name} publishes {port}"
            assert commands[name].args.host in WILDCARD_HOSTS, f"{name} publishes {port}, binds it to loopback"
            published.append(host_side)
    gateways = [name for name, command in commands.items() if command.module == "gateway"]
    assert all(services[name].get("ports") for name in gateways), "clients reach each stack through its gateway"
    assert all(published) and len(published) == len(set(published)), published


@pytest.mark.parametrize("profile", PROFILES)
def test_gpu_reservations_fit_the_devices_commands_use(services, commands, profile):
    """A GPU for each process that uses one, the verifier's ranks one each (its --tp), no GPU
    reserved and left idle, no GPU reserved twice, and NCCL drafts only from GPU drafters."""
    active = _active(services, profile)
    reserved_ids: list[str] = []
    for name, service in active.items():
        indices, count = _cuda_indices(commands[name]), _gpu_count(service)
        assert bool(indices) == (count > 0), f"{name}: uses GPUs {indices}, reserves {count}"
        assert all(i is None or i < count for i in indices), f"{name}: uses GPUs {indices} of {count}"
        if commands[name].module == "verifier_svc" and indices:
            assert len(set(indices)) == commands[name].args.tp == count, f"{name}: --tp vs {count} GPUs"
        reserved_ids += _gpu_ids(service)
    assert len(reserved_ids) == len(set(reserved_ids)), f"{profile}: a GPU reserved twice: {reserved_ids}"
    [verifier] = [name for name in active if commands[name].module == "verifier_svc"]
    if commands[verifier].args.data_plane == "nccl":
        for name in active:
            if commands[name].module in ("verifier_svc", "drafter_svc"):
                assert _cuda_indices(commands[name]), f"{name} has no GPU for the NCCL data plane"
    if profile == "cpu":
        for name, service in active.items():
            assert not _gpu_reservations(service), f"{name} reserves a GPU"
            assert getattr(commands[name].args, "device", "cpu") == "cpu", name


def test_gpu_services_share_host_ipc_and_nccl_settings(services):
    gpu_services = [name for name, service in services.items() if _gpu_reservations(service)]
    assert gpu_services
    for name in gpu_services:
        service = services[name]
        assert service["ipc"] == "host" and service["shm_size"], name
        assert {"NCCL_DEBUG", "NCCL_SOCKET_IFNAME"} <= set(service["environment"]), name


@pytest.mark.parametrize("profile", PROFILES)
def test_models_are_mounted_read_only_where_commands_read_them(services, commands, profile):
    """Each model directory is the bundled one (in the image) or sits on a read-only mount that
    fails on a wrong host path; the gateway tokenizes with the verifier's model."""
    active = _active(services, profile)
    sources = {}
    for name, service in active.items():
        path = _model_dir(commands, name)
        mount = _mount_over(service, path)
        if Path(path).is_relative_to(BUNDLED):
            assert mount is None, f"{name}: {mount} hides the bundled model at {path}"
            continue
        assert mount is not None, f"{name} reads {path}, which nothing is mounted on"
        assert mount.get("read_only") is True, f"{name}: {mount['target']} is writable"
        if mount["type"] == "bind":
            assert mount.get("bind", {}).get("create_host_path") is False, f"{name}: {mount}"
        sources[commands[name].module] = (mount["source"], Path(path).relative_to(mount["target"]))
    if "gateway" in sources or "verifier_svc" in sources:
        assert sources.get("gateway") == sources.get("verifier_svc"), sources
    if profile == "cpu":
        for name, service in active.items():  # the bundled pair ships in the image
            assert "--model" not in _argv(service) and not service.get("volumes"), name


def test_named_volumes_are_declared(raw_compose, services):
    for name, service in services.items():
        for mount in _mounts(service):
            if mount["type"] == "volume":
                assert mount["source"] in raw_compose.get("volumes", {}), f"{name}: {mount['source']}"


def test_drafter_replicas_share_one_gpu_lock_volume(services, commands):
    """cuda:auto spreads replicas over their GPUs through lock files: the lock directory must be
    one named volume for all of them, created in the image for the non-root user."""
    auto = [name for name, command in commands.items() if getattr(command.args, "device", "") == "cuda:auto"]
    assert auto
    for name in auto:
        lock_dir = commands[name].args.gpu_lock_dir
        mount = _mount_over(services[name], lock_dir)
        assert mount is not None and mount["type"] == "volume", f"{name}: {lock_dir} is not on a named volume"
        build = services[name]["build"]
        runs = " ".join(a for op, a in _instructions(DOCKER / build["context"] / build["dockerfile"]) if op == "RUN")
        assert f"mkdir -p {lock_dir}" in runs and "chown" in runs, f"{name}: the image does not create {lock_dir}"


@pytest.mark.parametrize("module", SERVICE_MODULES)
def test_service_parsers_accept_compose_flags(services, module, monkeypatch):
    """The exact arguments compose passes are ones the service's own argparse accepts."""
    for name in TORCHRUN_ENV:
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


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_image_healthcheck_probes_the_port_its_command_serves(dockerfile):
    """The image's own HEALTHCHECK (and compose's `python -m minedraft.healthcheck`) run the
    venv's python, against the port the default command serves on."""
    steps = _instructions(dockerfile)
    final_stage = steps[max(i for i, (op, _) in enumerate(steps) if op == "FROM"):]
    env = dict(pair.split("=", 1) for op, a in final_stage if op == "ENV" for pair in shlex.split(a) if "=" in pair)
    assert env["PATH"].split(":")[0] == "/opt/venv/bin", env["PATH"]
    probe = shlex.split(" ".join(a for op, a in final_stage if op == "HEALTHCHECK"))
    _, probed_port = _address(re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], probe[-1]))
    command = json.loads([a for op, a in final_stage if op == "CMD"][-1])
    served_port = int(command[command.index("--port") + 1])
    assert probed_port == served_port, (probe, command)
    exposed = " ".join(a for op, a in final_stage if op == "EXPOSE").split()
    assert str(served_port) in exposed, exposed


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
