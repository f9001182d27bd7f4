"""The compose profile `monitoring`, checked without a Docker engine for what would break it:
Prometheus scrapes every stack's gateway by a service name and port that gateway serves its
metrics on, reads the configuration compose mounts where its command looks, Grafana's data
source is that Prometheus and is the one the dashboard's panels name, the dashboard is where
the provisioning loads it from, and every query names metrics the gateway defines."""

from __future__ import annotations

import json
import re
from pathlib import Path, PurePosixPath

import pytest
import yaml
from docker_helpers import DOCKER, MONITORING, PROFILES, in_profile, split_address

from gateway.metrics import GatewayMetrics
from prometheus_client import CollectorRegistry

pytest_plugins = ["docker_helpers"]  # raw_compose, services, commands

WILDCARD_HOSTS = ("0.0.0.0", "::", "[::]")
# PromQL words that are not metric names: functions, aggregations, keywords, label names.
PROMQL_WORDS = {"sum", "rate", "max", "min", "avg", "by", "without", "histogram_quantile", "le", "irate",
                "increase", "position", "layout", "drafter", "kind", "code", "finished_reason", "e6"}


def _flag(argv: list[str], name: str) -> str:
    """The value of --name=VALUE in an argv (Prometheus' flag style)."""
    [value] = [arg.split("=", 1)[1] for arg in argv if arg.startswith(f"--{name}=")]
    return value


def _host_file(service: dict, container_path: str) -> Path:
    """The host file a bind mount puts at container_path (at it or at a directory above)."""
    for mount in service.get("volumes", []):
        if mount["type"] == "bind" and PurePosixPath(container_path).is_relative_to(mount["target"]):
            assert mount.get("read_only") is True, f"{mount['target']} is writable"
            assert mount.get("bind", {}).get("create_host_path") is False, mount
            relative = PurePosixPath(container_path).relative_to(mount["target"])
            return (DOCKER / mount["source"] / relative).resolve()
    raise AssertionError(f"nothing is mounted at {container_path}")


@pytest.fixture(scope="module")
def monitoring(services) -> dict[str, dict]:
    active = {name: s for name, s in services.items() if MONITORING in s.get("profiles", [])}
    assert set(active) == {"prometheus", "grafana"}, active
    return active


@pytest.fixture(scope="module")
def prometheus_config(monitoring) -> dict:
    argv = [str(arg) for arg in monitoring["prometheus"]["command"]]
    return yaml.safe_load(_host_file(monitoring["prometheus"], _flag(argv, "config.file")).read_text())


def _metric_names() -> set[str]:
    """Every series name the gateway exports: counters with _total, histograms' parts."""
    registry = CollectorRegistry()
    GatewayMetrics(registry)
    names = set()
    for family in registry.collect():
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}.get(family.type, [""])
        names.update(family.name + suffix for suffix in suffixes)
    return names


def test_images_are_pinned(monitoring):
    for name, service in monitoring.items():
        tag = service["image"].rsplit(":", 1)[-1]
        assert re.fullmatch(r"v?\d+\.\d+\.\d+", tag), f"{name}: {service['image']} is not pinned to a version"


@pytest.mark.parametrize("profile", PROFILES)
def test_prometheus_scrapes_each_stacks_gateway_on_its_metrics_port(services, commands, prometheus_config,
                                                                    profile):
    targets = [(target, job.get("metrics_path", "/metrics")) for job in prometheus_config["scrape_configs"]
               for group in job["static_configs"] for target in group["targets"]]
    gateways = [name for name in in_profile(services, profile) if commands[name].module == "gateway"]
    assert gateways
    for gateway in gateways:
        [(target, path)] = [(t, p) for t, p in targets if split_address(t)[0] == gateway]
        args = commands[gateway].args
        assert path == "/metrics"
        assert split_address(target)[1] == args.metrics_port > 0, f"{target}: {gateway} serves metrics on " \
                                                                   f"{args.metrics_port}"
        assert args.host in WILDCARD_HOSTS, f"{gateway} binds its metrics to {args.host} only"
        assert str(args.metrics_port) in [str(p) for p in services[gateway].get("expose", [])]
    for target, _ in targets:
        assert split_address(target)[0] in services, f"{target} names no service"


def test_grafana_reads_that_prometheus(monitoring):
    grafana, prometheus = monitoring["grafana"], monitoring["prometheus"]
    provisioning = grafana["environment"]["GF_PATHS_PROVISIONING"]
    sources = yaml.safe_load(_host_file(grafana, f"{provisioning}/datasources/prometheus.yml").read_text())
    [source] = sources["datasources"]
    url = re.fullmatch(r"http://([\w-]+):(\d+)", source["url"])
    assert url and url.group(1) == "prometheus", source["url"]
    listen = _flag([str(arg) for arg in prometheus["command"]], "web.listen-address")
    assert split_address(listen) == ("0.0.0.0", int(url.group(2))), listen
    assert grafana["depends_on"]["prometheus"]["condition"] == "service_healthy"
    assert "healthcheck" in prometheus


def test_dashboard_is_provisioned_and_queries_metrics_the_gateway_defines(monitoring):
    grafana = monitoring["grafana"]
    provisioning = grafana["environment"]["GF_PATHS_PROVISIONING"]
    sources = yaml.safe_load(_host_file(grafana, f"{provisioning}/datasources/prometheus.yml").read_text())
    uid = sources["datasources"][0]["uid"]
    providers = yaml.safe_load(_host_file(grafana, f"{provisioning}/dashboards/minedraft.yml").read_text())
    [provider] = providers["providers"]
    dashboards = _host_file(grafana, provider["options"]["path"])
    assert dashboards.is_dir()
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert _host_file(grafana, home).is_file()
    defined = _metric_names()
    queried = set()
    for path in dashboards.glob("*.json"):
        dashboard = json.loads(path.read_text())
        for panel in dashboard["panels"]:
            assert panel["datasource"]["uid"] == uid, f"{path.name}: {panel['title']}"
            for target in panel["targets"]:
                assert target["datasource"]["uid"] == uid
                expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\"[^\"]*\"", "", target["expr"])
                names = set(re.findall(r"[a-zA-Z_][a-zA-Z0-9_]*", expr)) - PROMQL_WORDS
                assert names <= defined, f"{path.name}: {panel['title']}: {names - defined} not defined"
                queried |= names
    for needed in ("minedraft_generation_tokens_total", "minedraft_overlap_seconds_total", "minedraft_steps_total",
                   "minedraft_spec_decode_num_accepted_tokens_per_pos_total", "minedraft_drafter_requests"):
        assert needed in queried, f"the dashboard shows no {needed}"
