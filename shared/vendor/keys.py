"""Every Redis key of a vendor lane, under one hash tag per vendor (`{vendor:<name>}`).

A lane's scripts touch these keys together, so they share one Redis Cluster slot; a
vendor's own limit bounds the traffic of its lane far below what one slot serves. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class VendorKeys:
    vendor: str
    prefix: str = "splatq"

    @property
    def tag(self) -> str:
        return f"{self.prefix}:{{vendor:{self.vendor}}}"

    @property
    def slots(self) -> str:
        """ZSET: concurrency slots held, member -> lease expiry (ms)."""
        return f"{self.tag}:slots"

    def tenant_slots(self, tenant: str) -> str:
        return f"{self.tag}:slots:t:{tenant}"

    @property
    def holders(self) -> str:
        """HASH: member -> the permit id its slot was last granted under (resends)."""
        return f"{self.tag}:holders"

    @property
    def rate(self) -> str:
        """STRING: the GCRA theoretical arrival time (ms) of the vendor's rate."""
        return f"{self.tag}:rate"

    def tenant_rate(self, tenant: str) -> str:
        return f"{self.tag}:rate:t:{tenant}"

    @property
    def waiting(self) -> str:
        """ZSET: members waiting for a permit -> their ticket (job age: FIFO, fleet-wide)."""
        return f"{self.tag}:waiting"

    @property
    def seen(self) -> str:
        """HASH: waiting member -> when it last asked (ms); a silent waiter is dropped."""
        return f"{self.tag}:seen"

    @property
    def pause(self) -> str:
        """STRING (PX): the lane is paused until this time (ms): the vendor said slow down."""
        return f"{self.tag}:pause"

    @property
    def breaker(self) -> str:
        """HASH: the circuit (state, consecutive failures, open until, open period, probe)."""
        return f"{self.tag}:breaker"

    def reported(self, report_id: str) -> str:
        """STRING (PX): an outcome report already applied (a resend is not counted twice)."""
        return f"{self.tag}:reported:{report_id}"

    def inbox(self, prediction_id: str) -> str:
        """STRING (PX): a prediction's final state as the vendor's webhook delivered it."""
        return f"{self.tag}:inbox:{prediction_id}"

    def tenant_keys(self, tenant: str) -> tuple[str, str]:
        """(tenant slots, tenant rate): the per-tenant keys, or the vendor's own when no
        tenant limit applies (the script is told 0 and leaves them alone)."""
        return self.tenant_slots(tenant or "-"), self.tenant_rate(tenant or "-")
