"""What a benchmark ran on, stored beside its numbers so a run can be compared with another."""

from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path


def git_commit() -> str:
    """The checkout's commit, or "unknown" outside a git checkout."""
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parent, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _version(distribution: str) -> str | None:
    """An installed package's version; None when it is not installed (an optional extra)."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def processor() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux; else what the platform says): machines of
    one size differ by model, and runs on two models are not to be compared."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def environment() -> dict:
    import grpc
    import torch

    return {"commit": git_commit(), "python": platform.python_version(), "torch": torch.__version__,
            "transformers": _version("transformers"), "grpc": grpc.__version__,
            "machine": platform.machine(), "processor": processor(), "cpus": os.cpu_count()}
