"""Optional dependencies, pyproject's extras: what only some features need stays out of the
services' install (and images), and is imported by those features alone, when they run."""

from __future__ import annotations

import importlib
from types import ModuleType


def require(module: str, extra: str, feature: str) -> ModuleType:
    """Import `module` for `feature`, or raise an ImportError that names the extra to install."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name is None or err.name != module.partition(".")[0]:
            raise                               # the module is there but broken: its own error
        raise ModuleNotFoundError(f"{feature} needs {module}, which is not installed: "
                                  f"pip install 'minedraft[{extra}]'", name=err.name) from None
