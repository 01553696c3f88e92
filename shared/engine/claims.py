"""Where an idempotency claim may live, and which claim answers for a key. Pure; the reads
are `JobQueue.claim_status`, `claim` and `enqueue`.

A keyed job and its claim share one slot, so `enqueue.lua` checks the claim and creates the
job in one script (docs/architecture.md#idempotency). The partition follows the job's route:
the key's own partition (`KeySchema.partition_for`), or -- for a tenant under a running cap
-- the tenant's home partition, where its cap is one counter (`home_partition`). A tenant's
cap can change while a claim lives (24 h by default), so a key may be held in either of
those two places, and every lookup reads both: the same key answers with the same job
whatever the tenant's cap is now.
"""

from __future__ import annotations

from collections.abc import Mapping

from splatq.shared.engine.fairness import home_partition
from splatq.shared.engine.keys import KeySchema

Claim = tuple[str, str]  # (status PENDING|PROCESSING|COMPLETED|FAILED, job id)


def claim_partitions(keys: KeySchema, tenant: str, logical_key: str) -> tuple[int, ...]:
    """Every partition a claim of `logical_key` may live in: the key's own, then the
    tenant's home partition when that is another one."""
    own = keys.partition_for(logical_key)
    if not tenant or keys.partitions == 1:
        return (own,)
    home = home_partition(tenant, keys.partitions)
    return (own,) if home == own else (own, home)


def parse_claim(raw: object) -> Claim | None:
    """A claim string `STATUS job_id` as (status, job id); None for an absent key."""
    if raw is None:
        return None
    status, _, job_id = str(raw).partition(" ")
    return status, job_id


def is_live(claim: Claim | None) -> bool:
    """A FAILED claim is free: a failed or canceled job may be submitted again."""
    return claim is not None and claim[0] != "FAILED"


def answering(found: Mapping[int, Claim | None], routed: int) -> Claim | None:
    """The claim that answers for a key, given what each of its places holds: a live one
    (the routed partition's first), else the routed partition's FAILED one, else any."""
    ordered = [routed, *sorted(p for p in found if p != routed)]
    for partition in ordered:
        claim = found.get(partition)
        if is_live(claim):
            return claim
    for partition in ordered:
        claim = found.get(partition)
        if claim is not None:
            return claim
    return None
