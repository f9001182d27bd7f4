"""The Docker images, checked without a Docker engine: the Dockerfiles copy files that exist
and are sent, build in pinned stages to a non-root image, and their HEALTHCHECK and CMD agree
on the port the service serves."""

from __future__ import annotations

import fnmatch
import json
import re
import shlex

import pytest
from docker_helpers import DOCKER, ROOT, instructions, split_address

DOCKERFILES = [DOCKER / "Dockerfile.cuda", DOCKER / "Dockerfile.cpu"]


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
    copies = [args.split() for op, args in instructions(dockerfile) if op == "COPY"]
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
    steps = instructions(dockerfile)
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
    steps = instructions(dockerfile)
    final_stage = steps[max(i for i, (op, _) in enumerate(steps) if op == "FROM"):]
    env = dict(pair.split("=", 1) for op, a in final_stage if op == "ENV" for pair in shlex.split(a) if "=" in pair)
    assert env["PATH"].split(":")[0] == "/opt/venv/bin", env["PATH"]
    probe = shlex.split(" ".join(a for op, a in final_stage if op == "HEALTHCHECK"))
    _, probed_port = split_address(re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], probe[-1]))
    command = json.loads([a for op, a in final_stage if op == "CMD"][-1])
    served_port = int(command[command.index("--port") + 1])
    assert probed_port == served_port, (probe, command)
    exposed = " ".join(a for op, a in final_stage if op == "EXPOSE").split()
    assert str(served_port) in exposed, exposed


def test_cpu_image_takes_torch_from_the_cpu_index():
    args = dict(a.split("=", 1) for op, a in instructions(DOCKERFILES[1]) if op == "ARG" and "=" in a)
    assert args["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"


def _requirement_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0].lower() for r in requirements}


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_images_hold_the_services_dependencies_and_no_extras(dockerfile):
    """What only tests, `make protos` and benchmarks need is an extra, which the images leave out."""
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    base = _requirement_names(project["dependencies"])
    assert not base & {"transformers", "grpcio-tools", "matplotlib"}, base
    assert "grpcio-tools" in _requirement_names(extras["protos"]) and "transformers" in _requirement_names(extras["peers"])
    assert "minedraft[protos,peers,bench]" in extras["dev"]
    runs = " ".join(a for op, a in instructions(dockerfile) if op == "RUN")
    installs = re.findall(r"pip install (?:--\S+ \S+ )*(\S+)", runs)
    assert "." in installs and not any(i.startswith(".[") for i in installs), installs
