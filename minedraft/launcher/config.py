"""What `minedraft serve` starts: one frozen config for the three services on one host."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from minedraft import bundled
from minedraft.constants import ADMIN_PORT, DATA_PLANES, GATEWAY_PORT, HTTP_PORT, MODES
from minedraft.service.placement import parse_cpus
from minedraft.service.runtime import LOG_FORMATS


@dataclass(frozen=True)
class ServeConfig:
    mode: str = "auto"             # one of constants.MODES
    k: int = 4
    # auto: requests running at once (split over two batches when they overlap);
    # psd: requests per batch (each of the two); sd and ar: requests in the one batch.
    max_batch: int = 16
    port: int = GATEWAY_PORT
    admin_port: int = ADMIN_PORT   # the drafter-pool admin API, always on 127.0.0.1 (0 with port 0)
    http_port: int = HTTP_PORT     # the OpenAI-compatible HTTP API on `host`; 0: off (port 0: any free one)
    metrics_port: int = 0          # the gateway's Prometheus metrics (GET /metrics) on `host`; 0: off
    host: str = "127.0.0.1"
    target: str = bundled.TARGET
    draft: str = bundled.DRAFT
    target_revision: str = ""      # a Hugging Face revision where target / draft are Hub ids
    draft_revision: str = ""
    dtype: str = "float32"
    target_device: str = "cpu"
    draft_device: str = "cpu"
    target_threads: int = 1
    draft_threads: int = 1
    target_cpus: str = field(default_factory=lambda: "0" if (os.cpu_count() or 1) > 1 else "")
    draft_cpus: str = field(default_factory=lambda: "1" if (os.cpu_count() or 1) > 1 else "")
    data_plane: str = "unix"       # one of constants.DATA_PLANES; every process is on this host
    tp: int = 1                    # verifier tensor-parallel ranks
    drafters: int = 1              # drafters in the pool (ar mode starts none)
    num_blocks: int = 4096
    log_level: str = "WARNING"
    log_format: str = "text"       # one of service.runtime.LOG_FORMATS, for every service
    step_timeout_s: float = 30.0   # the least deadline of a gateway-to-service call
    max_waiting: int = 1024        # requests queued beyond the batches before RESOURCE_EXHAUSTED
    insecure: bool = False         # allow a non-loopback public API without TLS or API keys
    startup_timeout_s: float = 300.0
    synthetic_acceptance: tuple[float, ...] | None = None   # benchmarks only (rates new requests take in
                                                             # turn); `minedraft serve` never sets it
    random_weights: bool = False                # benchmarks only: config.json shapes, random weights
    auto_cycle_steps: int = 0                   # tests only: auto mode rotates its layouts every this many steps

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.data_plane not in DATA_PLANES:
            raise ValueError(f"data_plane must be one of {DATA_PLANES}, got {self.data_plane!r}")
        if self.log_format not in LOG_FORMATS:
            raise ValueError(f"log_format must be one of {LOG_FORMATS}, got {self.log_format!r}")
        if self.tp < 1 or self.drafters < 0:
            raise ValueError(f"tp must be >= 1 and drafters >= 0, got tp={self.tp}, drafters={self.drafters}")
        for name in ("target_cpus", "draft_cpus"):
            try:
                parse_cpus(getattr(self, name))
            except ValueError:
                raise ValueError(f"{name} must list cores like '0' or '2-3,5', got {getattr(self, name)!r}") from None

    @property
    def lent_cpus(self) -> str:
        """The drafters' cores the verifier computes on too while auto mode decodes plainly
        ('' = none): only a one-rank verifier on CPU borrows, and only cores not its own."""
        own, lent = parse_cpus(self.target_cpus), parse_cpus(self.draft_cpus)
        if self.mode != "auto" or self.tp != 1 or self.target_device != "cpu" or not own or not lent or own & lent:
            return ""
        return self.draft_cpus
