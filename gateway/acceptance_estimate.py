"""Per-request acceptance, estimated online for auto mode's planner.

A request's reach at position j, the chance that its drafts 1..j are all accepted, is its own
share of steps that drafted j and had j accepted (minedraft.metrics counts exactly that),
pulled by a number of pseudo-steps (the prior's strength) towards its own reach one position
before times the pool's conditional acceptance at j (at position 1: towards the pool's reach
there): a new request starts from what the others did, one the draft model predicts badly
(or well) moves away within a few steps, and a position it has not drafted yet follows its
own record up to there (pulled towards the pool's reach itself, a request whose drafts were
always accepted would be priced at the pool's rate past the positions it drafted, however
well it drafts).

How strongly depends on how much requests differ (an empirical-Bayes prior): the spread of
the recent requests' first-draft acceptance, less what their counts alone would scatter,
is the spread between requests, and a Beta prior of the pool's mean and that spread has a
strength of mean (1 - mean) / spread - 1 pseudo-steps, kept within [prior_strength,
MAX_STRENGTH]. Where requests differ (code against prose) a request's own record decides
within a few steps; where they are alike its few steps are mostly chance, and the pool
decides. (With every request alike at 0.7 and a strength of 4, one request's sd was
predicted 14-18 tok/s from plan to plan against plain decoding's steady 16-17 while its own
few steps came and went, and auto left sd, ahead, within seconds of each try.)

A request that has drafted little can be priced hopefully (`reach(..., hopeful=True)`): as one
whose drafts are accepted at the rate of a request one between-request standard deviation
above the requests' mean (`hope`).
Auto mode's planner gives such requests a short trial of drafting where that price says it
pays and the plain decoding it would otherwise choose leaves them unmeasured: plain decoding
tells nothing of a request's acceptance, so where requests differ (half drafted well, half
badly) a newcomer priced at the pool's mean was never drafted for, however well it would
have drafted.

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
    REQUESTS_KEPT = 128     # the latest requests drafted for, whose spread sets the prior's strength ...
    MIN_REQUESTS = 8        # ... once this many of them drafted at least MIN_REQUEST_STEPS times
    MIN_REQUEST_STEPS = 4
    MAX_STRENGTH = 64.0     # pseudo-steps at most, however alike the requests
    HOPE_UNKNOWN_SPREAD = 1 / 12    # the between-request variance and mean of first-draft
    HOPE_UNKNOWN_MEAN = 0.5         # acceptance taken while too few requests were measured to
                                    # tell them (rates spread evenly over [0, 1])

    def __init__(self, k_max: int, prior_strength: float = 4.0, initial_rate: float = 0.7) -> None:
        """prior_strength: the prior's least strength, and its strength until enough requests
        were measured to tell how much they differ."""
        self.k_max = k_max
        self.prior_strength = prior_strength
        self.initial_rate = initial_rate      # before anything was drafted anywhere
        self.pool = AcceptanceStats()
        self._requests: dict[int, AcceptanceStats] = {}     # the latest, by identity (held: ids stay unique)
        self._pool_reach: tuple[float, ...] | None = None   # until the pool's next step ...
        self._prior: tuple[float, float, float] | None = None   # ... and so are its strength, the
                                                                # spread and the hope (_measure_prior)

    def record(self, stats: AcceptanceStats, num_drafted: int, num_accepted: int) -> None:
        """One verified step of a request: counted in its own stats and in the pool's."""
        stats.record(num_drafted, num_accepted)
        self.pool.record(num_drafted, num_accepted)
        if num_drafted and id(stats) not in self._requests:
            self._requests[id(stats)] = stats
            if len(self._requests) > self.REQUESTS_KEPT:
                del self._requests[next(iter(self._requests))]
        self._pool_reach = None
        self._prior = None

    def strength(self) -> float:
        """The prior's strength in pseudo-steps (see the module's docstring). Worked out once
        per step of the pool, as its reach is."""
        return self._measured_prior()[0]

    def spread(self) -> float:
        """The variance of first-draft acceptance between requests (HOPE_UNKNOWN_SPREAD until
        MIN_REQUESTS were measured; 0 where they are all alike)."""
        return self._measured_prior()[1]

    def hope(self) -> float:
        """The first-draft rate of a request one between-request standard deviation above the
        requests' mean, each request weighing one rather than by its steps: a request drafted
        badly takes more steps to its end, and where half the requests drafted at 0.9 and half
        at 0.1 the pool's own rate read 0.32. Until MIN_REQUESTS were measured, of rates spread
        evenly (HOPE_UNKNOWN_MEAN + sqrt(HOPE_UNKNOWN_SPREAD), 0.79)."""
        return self._measured_prior()[2]

    def _measured_prior(self) -> tuple[float, float, float]:
        if self._prior is None:
            self._prior = self._measure_prior()
        return self._prior

    def _measure_prior(self) -> tuple[float, float, float]:
        """-> (the prior's strength, the between-request variance, the hopeful rate)."""
        counts = [(s.accepted_at[0], s.drafted_at[0]) for s in self._requests.values()
                  if s.drafted_at and s.drafted_at[0] >= self.MIN_REQUEST_STEPS]
        if len(counts) < self.MIN_REQUESTS:
            unknown = self.HOPE_UNKNOWN_SPREAD
            return self.prior_strength, unknown, self.HOPE_UNKNOWN_MEAN + unknown ** 0.5
        steps = sum(n for _, n in counts)
        mean = sum(x for x, _ in counts) / steps
        per_request = sum(x / n for x, n in counts) / len(counts)
        if not 0.0 < mean < 1.0:
            return self.MAX_STRENGTH, 0.0, per_request
        # Method of moments: the steps-weighted scatter of the requests' rates about the mean
        # is (requests - 1) * mean (1 - mean) from their counts alone, plus the spread between
        # requests times (steps - sum(n^2) / steps).
        scatter = sum(n * (x / n - mean) ** 2 for x, n in counts)
        spread = (scatter - (len(counts) - 1) * mean * (1 - mean)) / (steps - sum(n * n for _, n in counts) / steps)
        if spread <= 0.0:
            return self.MAX_STRENGTH, 0.0, per_request
        strength = min(self.MAX_STRENGTH, max(self.prior_strength, mean * (1 - mean) / spread - 1))
        return strength, spread, min(1.0, per_request + spread ** 0.5)

    def fresh(self, stats: AcceptanceStats) -> bool:
        """Whether the request has drafted too little for its own record to tell its rate
        (fewer than MIN_REQUEST_STEPS steps that drafted)."""
        return not stats.drafted_at or stats.drafted_at[0] < self.MIN_REQUEST_STEPS

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

    def reach(self, stats: AcceptanceStats, hopeful: bool = False) -> tuple[float, ...]:
        """[j]: the request's estimated P(drafts 1..j+1 all accepted), non-increasing.
        hopeful: a fresh request pulled towards one whose drafts are accepted at the rate of
        `hope()` at every position (where the pool's own rates are lower: in a pool of good
        and bad requests the bad ones' many steps set them, and its deep positions are
        extrapolated from its first)."""
        prior, strength = self.pool_reach(), self.strength()
        hope = self.hope() if hopeful and self.fresh(stats) else 0.0
        out: list[float] = []
        for j in range(self.k_max):
            drafted = stats.drafted_at[j] if j < len(stats.drafted_at) else 0
            accepted = stats.accepted_at[j] if j < len(stats.accepted_at) else 0
            if not out:
                target = max(prior[0], hope)
            else:
                target = out[-1] * max(prior[j] / prior[j - 1] if prior[j - 1] > 0 else 0.0, hope)
            reach = (accepted + strength * target) / (drafted + strength)
            out.append(min(out[-1], reach) if out else reach)
        return tuple(out)
