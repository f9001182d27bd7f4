"""`minedraft serve` on one host: `config` (what to start), `cluster` (the child processes
and their supervision), `serve` (the command's loop), `examples` (what to try against it)."""

from minedraft.launcher.cluster import Cluster
from minedraft.launcher.config import ServeConfig
from minedraft.launcher.serve import serve_forever

__all__ = ["Cluster", "ServeConfig", "serve_forever"]
