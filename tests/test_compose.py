"""The compose file, checked without a Docker engine, for how its services fit together: it
resolves and its profiles are closed stacks; every command line is one the services' own parsers
accept; each service reaches its peers by the service names and ports they serve on; only the
gateways publish ports; and the healthchecks probe each service's own port and run."""

from __future__ import annotations

import importlib
import shlex
import shutil
import subprocess

import pytest
from docker_helpers import (COMPOSE, DOCKER, MONITORING, PROFILES, ROOT, TORCHRUN_ENV, argv_of, in_profile,
                            interpolate, module_of, run_probe, split_address, stack_services)
from grpc_health.v1 import health_pb2

DEPLOY_DOC = ROOT / "docs" / "deploy.md"
SERVICE_MODULES = ("verifier_svc", "drafter_svc", "gateway")
WILDCARD_HOSTS = ("0.0.0.0", "::", "[::]")
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")

pytest_plugins = ["docker_helpers"]  # raw_compose, services, commands, health_server


@pytest.fixture(scope="module")
def variables(raw_compose) -> dict[str, tuple[str, str]]:
    seen: dict[str, tuple[str, str]] = {}
    interpolate(raw_compose, seen)
    return seen


def _by_module(active: dict[str, dict]) -> dict[str, tuple[str, dict]]:
    found: dict[str, tuple[str, dict]] = {}
    for name, service in active.items():
        module = module_of(argv_of(service))
        assert module not in found, f"{module} runs in both {found[module][0]} and {name}"
        found[module] = (name, service)
    return found


def _published(port: str | int | dict) -> tuple[str, int]:
    """-> ([IP:]HOST_PORT, CONTAINER_PORT) of a `ports:` entry, short or long syntax."""
    if isinstance(port, dict):
        return str(port.get("published", "")), int(port["target"])
    host_side, _, container_port = str(port).rpartition(":")
    return host_side, int(container_port.split("/")[0])


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
    # So `--profile cpu` never also starts the GPU stack (profile-less services always start),
    # and monitoring starts only when asked for.
    for name, service in services.items():
        profiles = service.get("profiles", [])
        assert len(profiles) == 1 and profiles[0] in (*PROFILES, MONITORING), f"{name}: profiles {profiles}"


@pytest.mark.parametrize("profile", PROFILES)
def test_profile_is_a_closed_stack(services, profile):
    active = in_profile(services, profile)
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
    active = in_profile(services, profile)
    dialled = 0
    for name in active:
        for flag, (server, port_flag, host_flag) in PEER_FLAGS.items():
            values = getattr(commands[name].args, flag, None) or []
            for value in [values] if isinstance(values, str) else values:
                host, port = split_address(value)
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
    for name in in_profile(services, profile):
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
    for name, service in in_profile(services, profile).items():
        test = service["healthcheck"]["test"]
        assert test[:4] == ["CMD", "python", "-m", "minedraft.healthcheck"], f"{name}: {test}"
        host, port = split_address(test[4])
        assert host in LOOPBACK_HOSTS and port == commands[name].args.port, f"{name}: {test}"
        service_name = test[test.index("--service") + 1] if "--service" in test else ""
        servicer.set(service_name, health_pb2.HealthCheckResponse.SERVING)
        result = run_probe(address, *test[5:])
        assert result.returncode == 0, f"{name}: {test[5:]}: {result.stdout}{result.stderr}"


def test_only_gateways_publish_their_apis_and_monitoring_only_on_loopback(services, commands):
    """Of the stacks, only gateways publish ports: their public gRPC API and their HTTP API,
    both served on every interface (never the admin or metrics port). Monitoring UIs publish
    on loopback only. No two services take the same host port."""
    published = []
    for name, service in stack_services(services).items():
        args = commands[name].args
        served = {args.port, getattr(args, "http_port", None)} if commands[name].module == "gateway" else set()
        for port in service.get("ports", []):
            host_side, container_port = _published(port)
            assert commands[name].module == "gateway", f"only gateways publish ports, not {name}"
            assert container_port in served, f"{name} publishes {port}, which is not its gRPC or HTTP API"
            assert args.host in WILDCARD_HOSTS, f"{name} publishes {port}, binds it to loopback"
            published.append(host_side)
    gateways = [name for name, command in commands.items() if command.module == "gateway"]
    for name in gateways:
        ports = {_published(port)[1] for port in services[name].get("ports", [])}
        assert commands[name].args.port in ports, f"{name}: clients reach each stack through its gateway"
        http_port = getattr(commands[name].args, "http_port", None)
        assert http_port in ports, f"{name}: the HTTP API (--http-port {http_port}) is not published"
    for name, service in services.items():
        if MONITORING in service.get("profiles", []):
            for port in service.get("ports", []):
                host_side, _ = _published(port)
                assert host_side.split(":")[0] in LOOPBACK_HOSTS, f"{name} publishes {port} beyond this host"
                published.append(host_side.split(":")[-1])
    host_ports = [host_side.split(":")[-1] for host_side in published]
    assert all(host_ports) and len(host_ports) == len(set(host_ports)), published


@pytest.mark.parametrize("module", SERVICE_MODULES)
def test_service_parsers_accept_compose_flags(services, module, monkeypatch):
    """The exact arguments compose passes are ones the service's own argparse accepts."""
    for name in TORCHRUN_ENV:
        monkeypatch.delenv(name, raising=False)    # as in the containers: no torchrun around
    assert (ROOT / module / "__main__.py").is_file()
    parse_args = importlib.import_module(f"{module}.main").parse_args
    commands = [(name, argv_of(s)) for name, s in stack_services(services).items() if module_of(argv_of(s)) == module]
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
