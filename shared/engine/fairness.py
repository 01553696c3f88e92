"""Fair scheduling policy: what a tenant's job costs, how much a tenant weighs, how many of its
jobs may run at once, and which partition a tenant's work lives in. Pure; the Redis side is
`fair_push` / `fair_feed` / `fair_release` in `lua/_preamble.lua` (docs/architecture.md,
"Fair scheduling").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import orjson

from splatq.shared.engine.keys import KeySchema, StreamName

# Estimated cost of a job by quality, in the scheduler's units (a preview is 1). Deficit
# round-robin hands each tenant `quantum x weight` units per turn, so a tenant of full jobs
# gets one full job for every ten previews of another tenant of the same weight.
DEFAULT_COSTS: Mapping[str, int] = {"preview": 1, "full": 10}


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


def home_partition(tenant: str, partitions: int) -> int:
    """The partition that holds all of a capped tenant's work, so that its running cap is one
    counter in one slot (global across workers, enforced atomically). A cap bounds the
    tenant's throughput anyway, so confining it to one partition costs it nothing; tenants
    without a cap spread over every partition by job key."""
    return KeySchema(partitions=partitions).partition_for(f"tenant:{tenant}")


def parse_int_map(raw: str, what: str, maximum: int) -> dict[str, int]:
    """'preview=1,full=10' -> {'preview': 1, 'full': 10}; ValueError naming `what` when an
    item is not name=integer within [1, maximum]."""
    out: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in raw.split(","))):
        name, eq, value = item.partition("=")
        value = value.strip()
        if not eq or not name.strip() or not value.isdigit() or not 1 <= int(value) <= maximum:
            raise ValueError(f"expected {what}=integer within [1, {maximum}], got {item!r}")
        out[name.strip()] = int(value)
    return out
