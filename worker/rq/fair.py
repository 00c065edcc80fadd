"""Weighted fair share across tenants: stride scheduling, priorities inside a tenant.

Each tenant has a pass value; the worker tries tenants in order of increasing pass (ties:
the one served least recently), and inside a tenant its high, normal, then low queue.
Taking a job of tenant T adds 1/weight(T) to T's pass. A tenant tried before the winner
had nothing to take (empty queues, or its `max_running` reached): its pass is raised to the
winner's, so an idle tenant banks no credit and cannot burst when it returns.

The bound this gives (per worker, weights w): while tenants A and B both have jobs, after
any prefix of a worker's dequeues the number of jobs taken from each differs from its
weighted share by less than one job: |n_A/w_A - n_B/w_B| <= max(1/w_A, 1/w_B). A tenant
that arrives while A is backlogged gets its first job at the worker's next dequeue, and
then jobs in the ratio w_B : w_A. docs/tenants.md states what that means across workers.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class FairShare:
    weights: dict[str, float] = field(default_factory=dict)  # tenant -> weight (default 1)
    passes: dict[str, float] = field(default_factory=dict)
    last: dict[str, int] = field(default_factory=dict)  # tenant -> dequeue count when last served
    served: int = 0

    def weight(self, tenant: str) -> float:
        return self.weights.get(tenant, 1.0)

    def add(self, tenant: str) -> None:
        """A tenant joins at the lowest current pass (no credit for the time before)."""
        if tenant not in self.passes:
            self.passes[tenant] = min(self.passes.values(), default=0.0)
            self.last[tenant] = -1

    def order(self) -> list[str]:
        return sorted(self.passes, key=lambda t: (self.passes[t], self.last[t], t))

    def charge(self, winner: str, skipped: list[str]) -> None:
        """`winner`'s job was taken after `skipped` had none to give."""
        for t in skipped:
            self.passes[t] = max(self.passes[t], self.passes[winner])
        self.passes[winner] += 1.0 / self.weight(winner)
        self.served += 1
        self.last[winner] = self.served
