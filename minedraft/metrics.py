"""Acceptance statistics, defined once and used everywhere (engine, services, benchmarks).

Definitions, per verification step of one request with k drafted tokens:
  accepted   - drafted tokens the target kept (0..k).
  emitted    - accepted + 1: every step also yields one recovered or bonus token.
  mean acceptance length = total emitted / number of steps (bonus token INCLUDED);
                           plain decoding scores exactly 1.0.
  acceptance rate        = total accepted / total drafted.
  per-position rate      = fraction of steps that drafted position j whose draft j was accepted.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class AcceptanceStats:
    num_steps: int = 0
    num_drafted: int = 0
    num_accepted: int = 0
    drafted_at: list[int] = field(default_factory=list)    # [j]: steps that drafted position j
    accepted_at: list[int] = field(default_factory=list)   # [j]: steps whose draft j was accepted

    def record(self, num_drafted: int, num_accepted: int) -> None:
        if not 0 <= num_accepted <= num_drafted:
            raise ValueError(f"num_accepted {num_accepted} outside 0..{num_drafted}")
        self.num_steps += 1
        self.num_drafted += num_drafted
        self.num_accepted += num_accepted
        while len(self.drafted_at) < num_drafted:
            self.drafted_at.append(0)
            self.accepted_at.append(0)
        for j in range(num_drafted):
            self.drafted_at[j] += 1
            self.accepted_at[j] += j < num_accepted

    def merge(self, other: "AcceptanceStats") -> None:
        self.num_steps += other.num_steps
        self.num_drafted += other.num_drafted
        self.num_accepted += other.num_accepted
        for j in range(len(other.drafted_at)):
            if j == len(self.drafted_at):
                self.drafted_at.append(0)
                self.accepted_at.append(0)
            self.drafted_at[j] += other.drafted_at[j]
            self.accepted_at[j] += other.accepted_at[j]

    @property
    def mean_acceptance_length(self) -> float:
        return (self.num_accepted + self.num_steps) / self.num_steps if self.num_steps else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted / self.num_drafted if self.num_drafted else 0.0

    @property
    def acceptance_rate_per_position(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accepted_at, self.drafted_at)]

    def to_dict(self) -> dict:
        return {"num_steps": self.num_steps, "num_drafted": self.num_drafted,
                "num_accepted": self.num_accepted,
                "mean_acceptance_length": round(self.mean_acceptance_length, 4),
                "acceptance_rate": round(self.acceptance_rate, 4),
                "acceptance_rate_per_position": [round(r, 4) for r in self.acceptance_rate_per_position]}
