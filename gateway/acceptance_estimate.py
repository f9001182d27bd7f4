"""Per-request acceptance, estimated online for auto mode's planner.

A request's reach at position j, the chance that its drafts 1..j are all accepted, is its own
share of steps that drafted j and had j accepted (minedraft.metrics counts exactly that),
pulled towards the pool-wide share by `prior_strength` pseudo-steps: a new request starts from
what the others did, and one the draft model predicts badly (or well) moves away within a
few steps.
"""

from __future__ import annotations

from minedraft.metrics import AcceptanceStats


class AcceptanceEstimate:
    def __init__(self, k_max: int, prior_strength: float = 4.0, initial_rate: float = 0.5) -> None:
        self.k_max = k_max
        self.prior_strength = prior_strength
        self.initial_rate = initial_rate      # before anything was drafted anywhere
        self.pool = AcceptanceStats()

    def record(self, stats: AcceptanceStats, num_drafted: int, num_accepted: int) -> None:
        """One verified step of a request: counted in its own stats and in the pool's."""
        stats.record(num_drafted, num_accepted)
        self.pool.record(num_drafted, num_accepted)

    def pool_reach(self) -> tuple[float, ...]:
        rates = self.pool.acceptance_rate_per_position
        return tuple(rates[j] if j < len(rates) and self.pool.drafted_at[j] else self.initial_rate ** (j + 1)
                     for j in range(self.k_max))

    def reach(self, stats: AcceptanceStats) -> tuple[float, ...]:
        """[j]: the request's estimated P(drafts 1..j+1 all accepted)."""
        prior = self.pool_reach()
        out = []
        for j in range(self.k_max):
            drafted = stats.drafted_at[j] if j < len(stats.drafted_at) else 0
            accepted = stats.accepted_at[j] if j < len(stats.accepted_at) else 0
            out.append((accepted + self.prior_strength * prior[j]) / (drafted + self.prior_strength))
        return tuple(out)
