"""Fair scheduling policy: what a tenant's job costs, how much a tenant weighs, how many of its
jobs may run at once, and which partition a tenant's work lives in. Pure; the Redis side is
`fair_push` / `fair_feed` / `fair_release` in `lua/_preamble.lua` (docs/architecture.md,
"Fair scheduling").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import orjson

from splatq.shared.config.vocabulary import DEFAULT_COSTS, parse_int_map
from splatq.shared.engine.keys import KeySchema, StreamName

if TYPE_CHECKING:
    from splatq.shared.settings import Settings

__all__ = [
    "DEFAULT_COSTS", "FairScheduling", "TenantPolicy", "fairness_of", "home_partition",
    "parse_int_map",
]  # fmt: skip


@dataclass(frozen=True, slots=True)
class TenantPolicy:
    """One tenant's scheduling terms in one stream (class)."""

    weight: int = 1  # share of the stream relative to other tenants with waiting work
    max_running: int = 0  # jobs of this tenant fed and unfinished at once; 0 = no cap

    def __post_init__(self) -> None:
        if not 1 <= self.weight <= 1000:
            raise ValueError(f"tenant weight must be within [1, 1000], not {self.weight}")
        if self.max_running < 0:
            raise ValueError(f"tenant max_running must be >= 0, not {self.max_running}")


@dataclass(frozen=True, slots=True)
class FairScheduling:
    """The deployment's fair-scheduling terms (built from Settings)."""

    enabled: bool = True
    costs: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_COSTS))
    weights: Mapping[str, int] = field(default_factory=dict)  # tenant -> weight (default 1)
    # Running cap of every tenant per stream (0 = none); a tenant store may override it.
    max_running_interactive: int = 0
    max_running_synthesis: int = 0

    @property
    def quantum(self) -> int:
        """Credit per turn for weight 1: the largest cost, so that every turn of every tenant
        with waiting work can move at least one of its jobs."""
        return max(self.costs.values(), default=1)

    def cost(self, quality: str) -> int:
        return self.costs.get(quality, self.quantum)

    def policy(self, tenant: str, stream: StreamName) -> TenantPolicy:
        cap = (
            self.max_running_interactive
            if stream == StreamName.INTERACTIVE
            else self.max_running_synthesis
        )
        return TenantPolicy(weight=self.weights.get(tenant, 1), max_running=cap)

    def argument(self, quality: str, policy: TenantPolicy, group: str) -> str:
        """enqueue.lua's fair-scheduling argument (one JSON bundle)."""
        return orjson.dumps(
            {
                "cost": self.cost(quality),
                "weight": policy.weight,
                "cap": policy.max_running,
                "quantum": self.quantum,
                "group": group,
            }
        ).decode()


def fairness_of(settings: Settings) -> FairScheduling:
    """The deployment's fair-scheduling terms, from its settings (SPLATQ_FAIR_SCHEDULING,
    SPLATQ_JOB_COSTS, SPLATQ_TENANT_WEIGHTS, SPLATQ_TENANT_MAX_RUNNING_*)."""
    return FairScheduling(
        enabled=settings.fair_scheduling,
        costs=settings.job_costs,
        weights=settings.tenant_weights,
        max_running_interactive=settings.tenant_max_running_interactive,
        max_running_synthesis=settings.tenant_max_running_synthesis,
    )


def home_partition(tenant: str, partitions: int) -> int:
    """The partition that holds all of a capped tenant's work, so that its running cap is one
    counter in one slot (global across workers, enforced atomically). A cap bounds the
    tenant's throughput anyway, so confining it to one partition costs it nothing; tenants
    without a cap spread over every partition by job key."""
    return KeySchema(partitions=partitions).partition_for(f"tenant:{tenant}")
