"""Auto mode's chooser: from measured step costs and each request's acceptance, the layout
(one batch or two overlapped ones) and every request's draft length that maximise expected
accepted tokens per second. A pure function, so its choices can be tested by hand.

The overlap arithmetic, in one place. With per-request draft lengths k_i and q_ij, the chance
that request i's drafts 1..j are all accepted, a request emits E_i = 1 + sum_{j <= k_i} q_ij
tokens a step.

  ar   one batch, k = 0:            rate = n / V'(0..0)
  sd   one batch, draft then verify: rate = sum E_i / (t(k) + V(k) + 2 g)
  psd  batches A and B overlapped:   rate = (sum_A E + sum_B E) /
                                            (max(t(A), V(B)) + max(t(B), V(A)) + g)

where t and V are the drafter's and the verifier's busy time (gateway/cost_model.py), V' the
verifier's on the cores the idle drafter lends it (V where nothing is lent), and g the
gateway's share per call (plain decoding keeps two steps in flight: its g hides). Each rate
is then divided by the layout's measured slowdown, what its steps really took over what
the model predicted (contention, imperfect overlap), so a layout that runs worse than its
arithmetic says stops being chosen.

Draft lengths: a request drafts position j when the chance that position is reached and
accepted is at least a threshold; the threshold and a cap on the longest draft are searched
on a small grid, each layout evaluated exactly. The plan keeps the pair, so a request's k
follows its own acceptance at every step between plans (`Plan.draft_length`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import accumulate

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

    def draft_length(self, reach: tuple[float, ...], max_draft: int) -> int:
        """A request's k under this plan, from its current reach and its own cap."""
        if self.layout == "ar":
            return 0
        return min(self.cap, max_draft, sum(1 for q in reach if q >= self.threshold and q > 0))


def choose_plan(costs: StepCosts, requests: list[PlanRequest], k_max: int,
                layouts: tuple[str, ...] = LAYOUTS, slowdown: Mapping[str, float] | None = None) -> Plan:
    """The plan with the most expected tokens per second; ties go to the simpler layout.
    slowdown: per layout, measured step time over predicted (1 where not measured)."""
    if not requests:
        return Plan("ar", {}, ((),), 0.0, 0.0)
    slowdown = slowdown or {}
    reach = [_reach(r, k_max) for r in requests]          # [i][j]: P(position j+1 emitted as a draft)
    best: Plan | None = None
    considered: dict[str, float] = {}
    for layout in layouts:
        for threshold, cap, ks in _candidates(reach, k_max if layout != "ar" else 0):
            plan = _evaluate(layout, costs, requests, reach, ks, slowdown.get(layout, 1.0))
            if plan.layout != layout:
                continue                # all k = 0: that is ar, evaluated as such
            plan = Plan(plan.layout, plan.draft_lengths, plan.batches, plan.step_s, plan.tokens_per_s,
                        threshold=threshold, cap=cap)
            if plan.tokens_per_s > considered.get(layout, -1.0):
                considered[layout] = plan.tokens_per_s
            if best is None or plan.tokens_per_s > best.tokens_per_s * (1 + 1e-9):
                best = plan
    return Plan(best.layout, best.draft_lengths, best.batches, best.step_s, best.tokens_per_s, considered,
                best.threshold, best.cap)


def _reach(request: PlanRequest, k_max: int) -> list[float]:
    """The request's reach up to its cap, clamped to [0, 1] and made non-increasing."""
    cap = min(k_max, request.max_draft)
    reach = list(request.reach[:cap]) + [0.0] * max(0, cap - len(request.reach))
    return list(accumulate((min(1.0, max(0.0, q)) for q in reach), min))


def _candidates(reach: list[list[float]], k_max: int):
    """(threshold, cap, draft lengths) for every threshold and longest draft on the grid,
    each set of draft lengths once."""
    seen = set()
    for cap in range(k_max + 1):
        for threshold in THRESHOLDS:
            ks = tuple(min(cap, sum(1 for q in r if q >= threshold and q > 0)) for r in reach)
            if ks not in seen:
                seen.add(ks)
                yield threshold, cap, ks


def _evaluate(layout: str, costs: StepCosts, requests: list[PlanRequest], reach: list[list[float]],
              ks: tuple[int, ...], slowdown: float = 1.0) -> Plan:
    emitted = [1 + sum(r[:k]) for r, k in zip(reach, ks)]
    ids = [r.request_id for r in requests]
    g = costs.gateway_per_step
    if layout == "ar" or not any(ks):
        ks = tuple(0 for _ in ks)
        step = costs.verify(list(ks), borrowed=True) * slowdown
        return Plan("ar", dict(zip(ids, ks)), (tuple(ids),), step, len(ids) / step)
    if layout == "sd" or len(requests) < 2:
        step = (costs.draft(list(ks)) + costs.verify(list(ks)) + 2 * g) * slowdown
        return Plan("sd", dict(zip(ids, ks)), (tuple(ids),), step, sum(emitted) / step)
    # psd: longest drafts alternate between the batches, so both drafts and verifies balance.
    order = sorted(range(len(ids)), key=lambda i: -ks[i])
    halves = (order[0::2], order[1::2])
    draft = [costs.draft([ks[i] for i in half]) for half in halves]
    verify = [costs.verify([ks[i] for i in half]) for half in halves]
    step = (max(draft[0], verify[1]) + max(draft[1], verify[0]) + g) * slowdown
    return Plan("psd", dict(zip(ids, ks)), tuple(tuple(ids[i] for i in half) for half in halves),
                step, sum(emitted) / step)
