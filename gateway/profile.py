"""Auto mode's start-up profile: a few synthetic steps over a grid of batch sizes and draft
lengths, so the first plan starts from this deployment's measured costs instead of a guess.
The cost model keeps fitting every real call afterwards; the profile only seeds it.

The synthetic requests are real requests to the services (a short prompt of fixed token ids,
greedy, never streamed anywhere); they are freed before the Batch Manager's first real step.
"""

from __future__ import annotations

import logging
import time

from gateway.batch import DraftedItem
from gateway.engine_calls import EngineCalls, call_status
from gateway.pool import DrafterHandle
from gateway.request import ActiveRequest
from minedraft.sampling_params import SamplingParams
from minedraft.sequence import Sequence
from minedraft.v1 import engine_pb2

logger = logging.getLogger("minedraft.gateway")
PROMPT_TOKENS = 16
BATCH_SIZES = (1, 4, 16, 64)      # capped at max_batch
REPEATS = 2                 # steps per grid point (the first of a size also prefills)


def _request(index: int, max_tokens: int) -> ActiveRequest:
    prompt = [1 + (index * 7 + j) % 97 for j in range(PROMPT_TOKENS)]
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    seq = Sequence(f"profile-{index}", prompt, params, seed=index)
    return ActiveRequest(seq, detokenizer=None, stop_matcher=None)


async def profile(calls: EngineCalls, drafter: DrafterHandle | None, max_batch: int, k_max: int) -> None:
    """Run the grid; a failure ends the profile early (logged): the online fit takes over.
    Each size's first step (its prefill) and last steps ask for the drafter's cores (a
    verifier given none to borrow says so, and they count as ordinary steps)."""
    started = time.perf_counter()
    sizes = sorted({min(b, max_batch) for b in BATCH_SIZES})
    ks = sorted({0, 1, max(1, k_max // 2), k_max}) if drafter is not None else [0]
    steps_per_size = (len(ks) + 1) * REPEATS + 2
    max_tokens = len(sizes) * steps_per_size * (k_max + 1)     # a request takes part in every size's steps
    requests: list[ActiveRequest] = []
    try:
        for size in sizes:
            while len(requests) < size:
                requests.append(_request(len(requests), max_tokens))
                requests[-1].drafter = drafter
            batch = requests[:size]
            # The new requests' prefill runs on the lent cores, so the model knows what plain
            # decoding pays for arriving prompts (the own cores' prefill cost is measured by
            # every real sd and psd step); the first such step starts the lent cores' threads
            # and is not fitted. Then a warm-up back on the own cores, not fitted either.
            await _step(calls, drafter, batch, 0, borrow=True, observe=size != sizes[0])
            await _step(calls, drafter, batch, 0, borrow=False, observe=False)
            for k in ks:
                for _ in range(REPEATS):
                    await _step(calls, drafter, batch, k, borrow=False)
            for _ in range(REPEATS):
                await _step(calls, drafter, batch, 0, borrow=True)
    except Exception as err:        # noqa: BLE001 - the profile only seeds the model
        code, message = call_status(err)
        logger.warning("start-up profile stopped early (%s: %s); auto mode fits the costs as it runs",
                       code.name, message)
    finally:
        calls.free_on_verifier.extend(r.request_id for r in requests if r.known_to_verifier)
        if drafter is not None:
            drafter.pending_frees.extend(r.request_id for r in requests if r.known_to_drafter)
    logger.info("start-up profile: %d requests, draft lengths %s, %.2f s", len(requests), ks,
                time.perf_counter() - started)


async def _step(calls: EngineCalls, drafter: DrafterHandle | None, batch: list[ActiveRequest], k: int,
                borrow: bool, observe: bool = True) -> None:
    step_id = calls.next_step_id()
    sources, items = [], [DraftedItem(r, 0) for r in batch]
    if k and drafter is not None:
        answers = await calls.draft_all(step_id, {drafter: [(r, k) for r in batch]}, len(batch), "profile")
        (_, answer, _), = answers
        if isinstance(answer, BaseException):
            raise answer
        sources = [engine_pb2.DraftSource(drafter_id=drafter.drafter_id, draft_step_id=step_id)]
        items = [DraftedItem(r, k, 0) for r in batch]
    response, _ = await calls.verify(step_id, items, sources, layout="profile", borrow_cpus=borrow, observe=observe)
    for result in response.results:
        req = next(r for r in batch if r.request_id == result.request_id)
        req.seq.output_token_ids.extend(result.token_ids)
        if req.known_to_drafter:
            req.pending_diff.extend(result.token_ids)
