"""`python -m minedraft.healthcheck`, the probe the images and compose run, against a real
gRPC health server: it answers 0 for SERVING and 1 otherwise, never Docker's reserved 2."""

from __future__ import annotations

from docker_helpers import run_probe
from grpc_health.v1 import health_pb2

from minedraft.service.network import free_port

pytest_plugins = ["docker_helpers"]  # health_server


def test_healthcheck_serving_exits_0(health_server):
    servicer, address = health_server
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    servicer.set("minedraft.v1.Verifier", health_pb2.HealthCheckResponse.SERVING)
    assert run_probe(address).returncode == 0
    assert run_probe(address, "--service", "minedraft.v1.Verifier", "--timeout", "5").returncode == 0


def test_healthcheck_not_serving_exits_1(health_server):
    servicer, address = health_server
    servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    result = run_probe(address)
    assert result.returncode == 1 and "NOT_SERVING" in result.stdout
    assert run_probe(address, "--service", "no.such.Service").returncode == 1


def test_healthcheck_without_server_or_with_bad_usage_exits_1():
    address = f"127.0.0.1:{free_port()}"            # a port nothing listens on
    result = run_probe(address, "--timeout", "2")
    assert result.returncode == 1 and "UNAVAILABLE" in result.stdout
    assert run_probe().returncode == 1          # missing address: 1, never Docker's reserved 2
