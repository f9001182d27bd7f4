"""How the Batch Manager reads a failed call: whether a drafter is gone, and what a client
whose step failed on the verifier is told. Logged here, once per failure."""

from __future__ import annotations

import logging

import grpc

from gateway.engine_calls import call_status
from gateway.pool import DrafterHandle
from gateway.request import ActiveRequest

logger = logging.getLogger("minedraft.gateway")

# Status codes of a failed draft call that mean the drafter itself is gone (or unusable),
# not that one request's state there is bad.
DRAFTER_GONE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED,
                grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL)


def drafter_gone(drafter: DrafterHandle, requests: list[ActiveRequest], err: BaseException) -> bool:
    """True: the drafter leaves the pool (all its requests re-homed); False: only `requests`
    are re-homed (their state there is suspect, e.g. NOT_FOUND after it paired again)."""
    code, message = call_status(err)
    if code in DRAFTER_GONE:
        logger.warning("drafter %s failed (%s: %s); re-homing its %d requests",
                       drafter.address, code.name, message, len(drafter.request_ids))
        return True
    logger.error("draft step on %s failed (%s: %s); re-homing %d requests",
                 drafter.address, code.name, message, len(requests))
    return False


def verify_failure(batch_index: int, err: BaseException) -> tuple[grpc.StatusCode, str]:
    """-> (code, message) for the clients of a batch whose verify failed. A verifier that is
    down or hung reads as UNAVAILABLE."""
    code, message = call_status(err)
    logger.error("step failed for batch %d: %s %s", batch_index, code.name, message)
    if code in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED):
        code, message = grpc.StatusCode.UNAVAILABLE, f"the verifier did not answer in time ({message})"
    return code, f"engine step failed: {message}"
