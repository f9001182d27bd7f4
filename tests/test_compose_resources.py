"""The compose file's resources, checked without a Docker engine: GPU reservations fit the
devices the commands use, GPU services share host IPC and NCCL settings, models are mounted
read-only where the commands read them, and named volumes (the drafters' GPU locks) exist."""

from __future__ import annotations

from pathlib import Path

import pytest
from docker_helpers import DOCKER, PROFILES, Command, argv_of, in_profile, instructions, split_address

from minedraft import bundled

BUNDLED = Path(bundled.__file__).parent        # the bundled model pair: inside the package, in every image

pytest_plugins = ["docker_helpers"]  # raw_compose, services, commands


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
    verifier_host, _ = split_address(command.args.verifier)           # default: the verifier's model dir
    return commands[verifier_host].args.model


@pytest.mark.parametrize("profile", PROFILES)
def test_gpu_reservations_fit_the_devices_commands_use(services, commands, profile):
    """A GPU for each process that uses one, the verifier's ranks one each (its --tp), no GPU
    reserved and left idle, no GPU reserved twice, and NCCL drafts only from GPU drafters."""
    active = in_profile(services, profile)
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
    active = in_profile(services, profile)
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
            assert "--model" not in argv_of(service) and not service.get("volumes"), name


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
        runs = " ".join(a for op, a in instructions(DOCKER / build["context"] / build["dockerfile"]) if op == "RUN")
        assert f"mkdir -p {lock_dir}" in runs and "chown" in runs, f"{name}: the image does not create {lock_dir}"
