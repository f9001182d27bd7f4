"""Names and defaults that several commands and services share, defined once. No torch here."""

from __future__ import annotations

# How the Batch Manager runs the services (see gateway/batch_manager.py): auto picks the
# layout (one of LAYOUTS) and each request's draft length at every step from measured costs.
LAYOUTS = ("ar", "sd", "psd")
MODES = ("auto", *LAYOUTS)
# What `minedraft bench` compares: the serving modes and sd with the drafter sharing the
# verifier's cores, as standard speculative decoding runs.
BENCH_MODES = ("auto", "ar", "sd", "sd-colocated", "psd")
# Names of torch dtypes; torch itself is imported only where tensors are made.
DTYPES = ("float32", "bfloat16", "float16")
# How drafts travel drafter -> verifier: a torch.distributed pair group, a Unix domain socket
# (both on one host), or gRPC in-band.
DISTRIBUTED_BACKENDS = ("gloo", "nccl")
DATA_PLANES = (*DISTRIBUTED_BACKENDS, "unix", "inband")

GATEWAY_PORT = 50051
VERIFIER_PORT = 50061
DRAFTER_PORT = 50071
ADMIN_PORT = 50081           # the gateway's drafter-pool admin API, on loopback by default
HTTP_PORT = 8000             # the gateway's OpenAI-compatible HTTP API under `minedraft serve`
DEFAULT_GATEWAY = f"localhost:{GATEWAY_PORT}"
DEFAULT_ADMIN = f"localhost:{ADMIN_PORT}"
DEFAULT_VERIFIER = f"127.0.0.1:{VERIFIER_PORT}"

# The largest gRPC message any service sends or accepts (internal steps of large batches).
MAX_MESSAGE_BYTES = 256 << 20
# The largest request the public API accepts: a prompt of about a million characters.
MAX_REQUEST_BYTES = 4 << 20


def acceptance_rates_valid(rates) -> bool:
    """Whether synthetic acceptance rates (benchmark mode) are some, each a probability: each
    place that takes them (the verifier, its flag, the bench's) names its own field."""
    return bool(rates) and all(0.0 <= p <= 1.0 for p in rates)
