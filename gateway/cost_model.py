"""What a step costs, measured on the running services: the cost model auto mode plans with.

The services report their busy time per call (the step records). Two linear models, fitted
online by least squares with a weak prior so that a handful of calls already gives an answer:

  drafter  t(k_1..k_b) = a_t * max_i k_i + b_t * sum_i k_i + c_t
           (k_max sequential forwards; each costs a fixed part and a part per request drafting)
  verifier V(n)         = a_v + b_v * n      (n = sum_i (k_i + 1) tokens verified)

plus the gateway's own share per step (transport and bookkeeping), measured as wall time minus
busy time. No constant is assumed about the hardware: a GPU's flat V (memory-bound) and a CPU's
steep one (compute-bound) come out of the same fit.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


class LinearFit:
    """y ~ w . x by least squares over the last `window` observations, shrunk towards
    `prior` with weight `prior_weight` (ridge towards a guess, so early fits are sane)."""

    def __init__(self, prior: tuple[float, ...], prior_weight: float = 1.0, window: int = 512) -> None:
        self.prior = prior
        self.prior_weight = prior_weight
        self._rows: deque[tuple[tuple[float, ...], float]] = deque(maxlen=window)
        self._weights: tuple[float, ...] | None = None

    def observe(self, features: tuple[float, ...], value: float) -> None:
        if len(features) != len(self.prior):
            raise ValueError(f"expected {len(self.prior)} features, got {len(features)}")
        self._rows.append((features, value))
        self._weights = None

    @property
    def num_observations(self) -> int:
        return len(self._rows)

    @property
    def weights(self) -> tuple[float, ...]:
        if self._weights is None:
            self._weights = self._solve()
        return self._weights

    def predict(self, features: tuple[float, ...]) -> float:
        return sum(w * x for w, x in zip(self.weights, features))

    def _solve(self) -> tuple[float, ...]:
        """(X^T X + l I) w = X^T y + l prior, by Gaussian elimination (a few features only)."""
        d = len(self.prior)
        a = [[self.prior_weight if i == j else 0.0 for j in range(d)] for i in range(d)]
        rhs = [self.prior_weight * p for p in self.prior]
        for features, value in self._rows:
            for i in range(d):
                rhs[i] += features[i] * value
                for j in range(d):
                    a[i][j] += features[i] * features[j]
        for col in range(d):
            pivot = max(range(col, d), key=lambda r: abs(a[r][col]))
            a[col], a[pivot], rhs[col], rhs[pivot] = a[pivot], a[col], rhs[pivot], rhs[col]
            for row in range(d):
                if row != col and a[row][col]:
                    factor = a[row][col] / a[col][col]
                    a[row] = [x - factor * y for x, y in zip(a[row], a[col])]
                    rhs[row] -= factor * rhs[col]
        return tuple(rhs[i] / a[i][i] for i in range(d))


@dataclass(frozen=True)
class StepCosts:
    """A fitted model's answers, in seconds; what the planner needs and nothing else."""

    draft_per_forward: float        # a_t: each of the k_max sequential draft forwards
    draft_per_token: float          # b_t: each drafted token
    draft_fixed: float              # c_t
    verify_fixed: float             # a_v
    verify_per_token: float         # b_v
    gateway_per_step: float         # transport and bookkeeping around each call

    def draft(self, ks: list[int]) -> float:
        if not ks or max(ks) == 0:
            return 0.0
        return self.draft_fixed + self.draft_per_forward * max(ks) + self.draft_per_token * sum(ks)

    def verify(self, ks: list[int]) -> float:
        if not ks:
            return 0.0
        return self.verify_fixed + self.verify_per_token * sum(k + 1 for k in ks)


class CostModel:
    """Online fits of the drafter's and the verifier's busy time, and of the gateway's share."""

    def __init__(self, prior: StepCosts | None = None) -> None:
        prior = prior or StepCosts(1e-3, 1e-4, 1e-3, 5e-3, 5e-4, 5e-4)
        self._draft = LinearFit((prior.draft_per_forward, prior.draft_per_token, prior.draft_fixed))
        self._verify = LinearFit((prior.verify_fixed, prior.verify_per_token))
        self._gateway: deque[float] = deque([prior.gateway_per_step], maxlen=256)

    def observe_draft(self, ks: list[int], busy_s: float) -> None:
        if ks and max(ks) > 0:
            self._draft.observe((float(max(ks)), float(sum(ks)), 1.0), busy_s)

    def observe_verify(self, ks: list[int], busy_s: float) -> None:
        if ks:
            self._verify.observe((1.0, float(sum(k + 1 for k in ks))), busy_s)

    def observe_gateway(self, wall_s: float, busy_s: float) -> None:
        self._gateway.append(max(0.0, wall_s - busy_s))

    def costs(self) -> StepCosts:
        per_forward, per_token, fixed = (max(0.0, w) for w in self._draft.weights)
        verify_fixed, verify_per_token = (max(0.0, w) for w in self._verify.weights)
        gateway = sorted(self._gateway)[len(self._gateway) // 2]
        return StepCosts(per_forward, per_token, fixed, verify_fixed, verify_per_token, gateway)
