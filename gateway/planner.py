"""Auto mode's chooser: from measured step costs and each request's acceptance, the layout
(one batch or two overlapped ones) and every request's draft length that maximise expected
accepted tokens per second. A pure function, so its choices can be tested by hand.

The overlap arithmetic, in one place. With per-request draft lengths k_i and q_ij, the chance
that request i's drafts 1..j are all accepted, a request emits E_i = 1 + sum_{j <= k_i} q_ij
tokens a step.

  ar   one batch, k = 0:            rate = n / V'(0..0)
  sd   one batch, draft then verify: rate = sum E_i / (t(k) + d + V(k) + h g)
  psd  batches A and B overlapped:   rate = (sum_A E + sum_B E) / T, where with early verify
         T = M(max(t(A) + V(A), t(B) + V(B)) + g, max(t(A) + t(B), V(A) + V(B)))
       and without it
         T = M(t(A), V(B)) + M(t(B), V(A)) + 2 g

where t and V are the drafter's and the verifier's busy time (gateway/cost_model.py), d the
verifier's time taking a step's drafts off the data plane (before its forward: in psd's T,
V(X) stands for d + V(X)), V' the verifier's on the cores the idle drafter lends it (V where
nothing is lent, or where lending was measured to slow plain decoding down), and g the
gateway's share per call (plain decoding keeps two steps in flight: its g hides). With early
verify (the default: a step's verify goes out with its draft call and waits for the drafts
at the verifier) a batch passes through the gateway once a step, h = 1; in psd each batch
goes round draft, verify, gateway, and the cycle is the longer of that round and the
busier service's two calls. Without it (NCCL) h = 2, and psd pays g at each half-step: the
next pair of calls starts only when both of the last have come back through the gateway. M is the expected longer of two calls whose busy times stray from their
predictions by the model's measured jitter (`expected_max`): level draft and verify times
wait on whichever runs long. Without the second g and the jitter, psd's steps on the
reference machine took 1.1-1.45x their prediction against sd's 1.1-1.2x, and psd's measured
slowdown, learnt at whatever draft lengths a trial ran, priced it out at the ones that pay.

Every output token also carries its share of prompt prefill, rho prompt tokens per output
token (measured on recent requests), at the layout's own price c (ar on the lent cores, sd on
the verifier then the drafter, psd on both at once): serving rate = 1 / (1 / rate + rho c).
Each rate is corrected by the layout's measured slowdowns (gateway/auto.py: the seconds it
really took over what the model predicted for what it delivered, decoding and prefill
apart), so a layout that runs worse than its arithmetic says stops being chosen, and spread
over a horizon together with the one-off time of moving to it: the drafter's catch-up after
plain decoding, during which plain decoding goes on, on the verifier's own cores, where the
catch-up is long enough to run beside it (StepCosts.catch_up_pays).

Draft lengths: a request drafts position j when the chance that position is reached and
accepted is at least a threshold; the threshold and a cap on the longest draft are searched
on a small grid, each layout evaluated exactly. The plan keeps the pair, so a request's k
follows its own acceptance at every step between plans (`Plan.draft_length`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import accumulate, chain, repeat

from gateway.cost_model import StepCosts
from minedraft.constants import LAYOUTS
THRESHOLDS = tuple(i / 10 for i in range(11))


@dataclass(frozen=True)
class PlanRequest:
    request_id: str
    reach: tuple[float, ...]        # [j]: P(drafts 1..j+1 all accepted), non-increasing
    max_draft: int                  # this request's own cap: 0 = speculation off


@dataclass(frozen=True)
class Plan:
    layout: str
    draft_lengths: dict[str, int]
    batches: tuple[tuple[str, ...], ...]     # request ids per batch (two for psd)
    step_s: float                            # predicted time of one step (a cycle in psd)
    tokens_per_s: float
    considered: dict[str, float] = field(default_factory=dict)   # best rate of each layout
    threshold: float = 1.0                   # draft position j while P(reach j) >= threshold ...
    cap: int = 0                             # ... and j <= cap
    decode_tokens_per_s: float = 0.0         # the rate of its steps alone (no prefill, no slowdown)

    def draft_length(self, reach: tuple[float, ...], max_draft: int) -> int:
        """A request's k under this plan, from its current reach and its own cap."""
        if self.layout == "ar":
            return 0
        return min(self.cap, max_draft, _leading(reach, self.threshold))


def choose_plan(costs: StepCosts, requests: list[PlanRequest], k_max: int,
                layouts: tuple[str, ...] = LAYOUTS, slowdown: Mapping[str, float] | None = None,
                switch_s: Mapping[str, float] | None = None, horizon_s: float = 5.0,
                prefill_slowdown: Mapping[str, float] | None = None,
                meanwhile_tokens_per_s: float = 0.0) -> Plan:
    """The plan with the most expected tokens per second; ties go to the simpler layout.
    slowdown, prefill_slowdown: per layout, measured time over predicted, of decoding and of
    prefill (1 where not measured);
    switch_s: per layout, a one-off time of moving to it (the drafter catching up with the
    tokens verified while nothing drafted), spread over horizon_s, during which plain
    decoding goes on at meanwhile_tokens_per_s (0: the verifier waits for the catch-up).
    Each candidate is scored from sums alone; only the winner becomes a Plan (the gateway
    plans several times a second, on the cores the services compute on: for 64 requests on
    the reference machine 0.4 ms when they share one reach, 0.9 ms when each has its own)."""
    if not requests:
        return Plan("ar", {}, ((),), 0.0, 0.0)
    slowdown, prefill_slowdown = slowdown or {}, prefill_slowdown or {}
    switch_s = switch_s or {}
    # Requests of the same reach draft alike under every candidate: each kind is worked out once
    # (in plain decoding most requests never drafted and all share the pool's prior).
    kinds: dict[tuple[float, ...], int] = {}
    kind_of = [kinds.setdefault(tuple(_reach(r, k_max)), len(kinds)) for r in requests]
    reach = [list(kind) for kind in kinds]                  # [kind][j]: P(position j+1 emitted as a draft)
    counts = [0] * len(kinds)
    for kind in kind_of:
        counts[kind] += 1
    gains = [list(accumulate(r, initial=1.0)) for r in reach]     # [kind][k]: tokens emitted a step with k drafts
    best: tuple[float, str, float, int, tuple[int, ...], float, float] | None = None
    considered: dict[str, float] = {}
    for threshold, cap, kind_ks in _candidates(reach, k_max):
        emitted = sum(n * g[k] for n, g, k in zip(counts, gains, kind_ks))
        ks = kind_ks if len(counts) == len(requests) else \
            tuple(chain.from_iterable(repeat(k, n) for k, n in zip(kind_ks, counts)))   # (step times ignore order)
        for layout in layouts:
            step = layout_step_s(layout, costs, ks)
            if step is None:
                continue
            decode = emitted / step
            rate = costs.serving_rate(layout, decode / slowdown.get(layout, 1.0), prefill_slowdown.get(layout, 1.0))
            switching = switch_s.get(layout, 0.0)
            rate = (rate * horizon_s + min(rate, meanwhile_tokens_per_s) * switching) / (horizon_s + switching)
            considered[layout] = max(rate, considered.get(layout, -1.0))
            if best is None or rate > best[0] * (1 + 1e-9):
                best = (rate, layout, threshold, cap, kind_ks, step, decode)
    rate, layout, threshold, cap, kind_ks, step, decode = best
    ks = tuple(kind_ks[kind] for kind in kind_of)
    ids = [r.request_id for r in requests]
    if layout == "psd":
        order = _psd_order(ks)
        batches = (tuple(ids[i] for i in order[0::2]), tuple(ids[i] for i in order[1::2]))
    else:
        batches = (tuple(ids),)
    return Plan(layout, dict(zip(ids, ks)), batches, step, rate, considered, threshold, cap, decode)


def _leading(reach, threshold: float) -> int:
    """How many leading positions reach at least `threshold` (and more than zero)."""
    n = 0
    for q in reach:
        if q < threshold or q <= 0:
            break
        n += 1
    return n


def _reach(request: PlanRequest, k_max: int) -> list[float]:
    """The request's reach up to its cap, clamped to [0, 1] and made non-increasing."""
    cap = min(k_max, request.max_draft)
    reach = list(request.reach[:cap]) + [0.0] * max(0, cap - len(request.reach))
    return list(accumulate((min(1.0, max(0.0, q)) for q in reach), min))


def _candidates(reach: list[list[float]], k_max: int):
    """(threshold, cap, draft lengths) for every threshold and longest draft on the grid,
    each set of draft lengths once, with the first (threshold, cap) that gives it (all zero
    included: plain decoding's). Caps past a threshold's longest leading run give its run
    again, and so does a threshold that leads as far as the one before (runs shrink as the
    threshold rises): neither is built (at 64 requests the grid's 99 pairs held 15 sets,
    and building each took most of a plan's time)."""
    seen = set()
    previous = None
    for threshold in THRESHOLDS:
        base = [_leading(r, threshold) for r in reach]
        if base == previous:
            continue
        previous = base
        longest = min(k_max, max(base, default=0))
        for cap in range(longest + 1):
            ks = tuple(base) if cap == longest else tuple(min(cap, b) for b in base)
            if ks not in seen:
                seen.add(ks)
                yield threshold, cap, ks


def _psd_order(ks: tuple[int, ...]) -> list[int]:
    """Longest drafts first; the batches take every other one, so drafts and verifies balance."""
    return sorted(range(len(ks)), key=lambda i: -ks[i])


def layout_step_s(layout: str, costs: StepCosts, ks: tuple[int, ...]) -> float | None:
    """The time of one step (a cycle of both batches in psd) with these draft lengths; None
    where the layout does not apply (drafts in ar, none in sd or psd). psd with one request
    runs as sd does, one batch empty (the Batch Manager's step records say sd), and is
    priced so (AutoPlanner._layouts says where it is offered)."""
    g, d = costs.gateway_per_step, costs.data_plane_per_step
    drafting = any(ks)
    if layout == "ar":
        return None if drafting else costs.plain_verify(list(ks))
    if not drafting:
        return None
    hops = 1 if costs.early_verify else 2       # gateway round trips on a batch's way round
    if layout == "sd" or len(ks) < 2:
        return costs.draft(list(ks)) + d + costs.verify(list(ks)) + hops * g
    ordered = sorted(ks, reverse=True)
    halves = (ordered[0::2], ordered[1::2])
    draft = [costs.draft(half) for half in halves]
    verify = [d + costs.verify(half) for half in halves]       # each takes its drafts off the data plane first
    if costs.early_verify:
        chain = max(draft[0] + verify[0], draft[1] + verify[1]) + g
        return expected_max(chain, max(draft[0] + draft[1], verify[0] + verify[1]), costs.jitter)
    return (expected_max(draft[0], verify[1], costs.jitter) + expected_max(draft[1], verify[0], costs.jitter)
            + 2 * g)


def expected_max(a: float, b: float, jitter: float) -> float:
    """E[max(X, Y)] for independent normal X ~ (a, jitter a) and Y ~ (b, jitter b) (Clark's
    formula): a half-step of psd ends when the slower of its draft and its verify does, and
    two calls predicted level wait on whichever strays longer, so balancing them costs
    more than max(a, b) says (about 0.4 sigma of their difference when a = b)."""
    spread = jitter * math.hypot(a, b)
    if spread <= 0:
        return max(a, b)
    alpha = (a - b) / spread
    cdf = 0.5 * (1 + math.erf(alpha / math.sqrt(2)))
    pdf = math.exp(-0.5 * alpha * alpha) / math.sqrt(2 * math.pi)
    return a * cdf + b * (1 - cdf) + spread * pdf
