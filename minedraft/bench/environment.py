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


def environment() -> dict:
    import grpc
    import torch

    return {"commit": git_commit(), "python": platform.python_version(), "torch": torch.__version__,
            "transformers": _version("transformers"), "grpc": grpc.__version__,
            "machine": platform.machine(), "cpus": os.cpu_count()}
