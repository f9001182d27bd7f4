"""Per-request acceptance, estimated online for auto mode's planner.

A request's reach at position j, the chance that its drafts 1..j are all accepted, is its own
share of steps that drafted j and had j accepted (minedraft.metrics counts exactly that),
pulled by `prior_strength` pseudo-steps towards its own reach one position before times the
pool's conditional acceptance at j (at position 1: towards the pool's reach there): a new
request starts from what the others did, one the draft model predicts badly (or well) moves
away within a few steps, and a position it has not drafted yet follows its own record up to
there (pulled towards the pool's reach itself, a request whose drafts were always accepted
would be priced at the pool's rate past the positions it drafted, however well it drafts).

A position the pool has drafted too rarely to measure is extrapolated from the ones before it
(the last measured conditional acceptance, position after position), not set to a fixed guess:
a pessimistic guess for deep positions would keep drafts short, and short drafts never measure
the deep positions that would show they pay.

So is a position that only some of the pool's steps drafted (fewer than MIN_COVERAGE of them):
auto gives long drafts to the requests whose drafts were accepted, so a deep position's
measured rate is that of the requests that draft well, not the pool's. On the reference
machine (C = 8) the pool's reach at positions 5-8 read 0.42-0.44, against 0.34, 0.29, 0.24
and 0.20 measured at a fixed k = 8 on the same prompts, and every newcomer started from it.
"""

from __future__ import annotations

from minedraft.metrics import AcceptanceStats


class AcceptanceEstimate:
    MIN_MEASURED = 8        # steps that drafted a position before the pool's rate there is used ...
    MIN_COVERAGE = 0.75     # ... and the share of the drafting steps that drafted it

    def __init__(self, k_max: int, prior_strength: float = 4.0, initial_rate: float = 0.7) -> None:
        self.k_max = k_max
        self.prior_strength = prior_strength
        self.initial_rate = initial_rate      # before anything was drafted anywhere
        self.pool = AcceptanceStats()
        self._pool_reach: tuple[float, ...] | None = None   # until the pool's next step

    def record(self, stats: AcceptanceStats, num_drafted: int, num_accepted: int) -> None:
        """One verified step of a request: counted in its own stats and in the pool's."""
        stats.record(num_drafted, num_accepted)
        self.pool.record(num_drafted, num_accepted)
        self._pool_reach = None

    def pool_reach(self) -> tuple[float, ...]:
        """[j]: the pool's P(drafts 1..j+1 all accepted): measured where drafted often enough
        and by most of the pool's drafting steps, else the previous position's times the last
        measured conditional acceptance. Worked out once per step of the pool, not once per
        request at every replan and draft-length call."""
        if self._pool_reach is None:
            self._pool_reach = self._measure_pool_reach()
        return self._pool_reach

    def _measure_pool_reach(self) -> tuple[float, ...]:
        drafted, accepted = self.pool.drafted_at, self.pool.accepted_at
        out: list[float] = []
        conditional = self.initial_rate
        for j in range(self.k_max):
            if j < len(drafted) and drafted[j] >= max(self.MIN_MEASURED, self.MIN_COVERAGE * drafted[0]):
                reach = accepted[j] / drafted[j]
                if out and out[-1] > 0:
                    conditional = min(1.0, reach / out[-1])
                elif not out:
                    conditional = reach
            else:
                reach = (out[-1] if out else 1.0) * conditional
            out.append(reach)
        return tuple(out)

    def reach(self, stats: AcceptanceStats) -> tuple[float, ...]:
        """[j]: the request's estimated P(drafts 1..j+1 all accepted), non-increasing."""
        prior = self.pool_reach()
        out: list[float] = []
        for j in range(self.k_max):
            drafted = stats.drafted_at[j] if j < len(stats.drafted_at) else 0
            accepted = stats.accepted_at[j] if j < len(stats.accepted_at) else 0
            target = prior[0] if not out else out[-1] * (prior[j] / prior[j - 1] if prior[j - 1] > 0 else 0.0)
            reach = (accepted + self.prior_strength * target) / (drafted + self.prior_strength)
            out.append(min(out[-1], reach) if out else reach)
        return tuple(out)
