"""A vendor lane: the vendor's limits held in Redis for every worker process at once.

The rate of prediction creations is a GCRA (one arrival time per vendor, and per tenant when
the vendor has tenant limits); concurrency is a sorted set of leased slots, so a killed
worker's slot comes back when its lease lapses, and a job that takes a killed run's
prediction over adopts its slot. Waiters are served first come, fleet-wide. A 429/503 with
Retry-After pauses the whole lane; consecutive failures open its circuit. Every step is one
script in the vendor's slot (shared/vendor/lua/); this module is the thin I/O and the
arithmetic of the limits (pure, `lane_limits`).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from redis.asyncio import Redis

from splatq.shared.vendor.config import BreakerConfig, LimitsConfig, VendorConfig
from splatq.shared.vendor.keys import VendorKeys
from splatq.shared.vendor.scripts import LaneScript, LaneScripts

# A waiter that has not asked for this long (its process died) leaves the head of the line.
WAITER_STALE_MS = 5_000
# How often a waiter blocked by full slots asks again (times its place behind the free ones).
SLOT_POLL_MS = 50
REPORT_MARKER_TTL_MS = 120_000


@dataclass(frozen=True, slots=True)
class LaneLimits:
    """The GCRA and slot parameters a lane's scripts take (ms)."""

    interval_ms: float
    tau_ms: float
    concurrency: int
    tenant_interval_ms: float
    tenant_tau_ms: float
    tenant_concurrency: int
    slot_ttl_ms: int


def gcra(rate: int, per_s: float, safety: float) -> tuple[float, float]:
    """(emission interval, tolerance) in ms for `rate` per `per_s` at `safety` of it.

    GCRA with interval T and tolerance tau admits at most ceil((W + tau) / T) arrivals in any
    window of length W (the k-th after a first at t0 comes no earlier than t0 + kT - tau).
    With T = W / (rate * safety) that is at most `rate` for the vendor's window W = per_s as
    long as tau <= rate T - W. Half of that slack is the tolerance (a waiter a little late
    for its turn loses nothing); the other half absorbs jitter between our grant and the
    vendor's count of the arrival (network, clocks)."""
    window_ms = per_s * 1000.0
    interval = window_ms / (rate * safety)
    slack = rate * interval - window_ms
    return interval, max(0.0, slack / 2)


def lane_limits(limits: LimitsConfig) -> LaneLimits:
    interval, tau = gcra(limits.rate, limits.per_s, limits.safety)
    t_interval, t_tau = 0.0, 0.0
    if limits.tenant_rate:
        t_interval, t_tau = gcra(limits.tenant_rate, limits.per_s, limits.safety)
    return LaneLimits(
        interval_ms=interval,
        tau_ms=tau,
        concurrency=limits.concurrency,
        tenant_interval_ms=t_interval,
        tenant_tau_ms=t_tau,
        tenant_concurrency=limits.tenant_concurrency,
        slot_ttl_ms=round(limits.slot_ttl_s * 1000),
    )


@dataclass(frozen=True, slots=True)
class Permit:
    """A granted permit: `kind` is new, held (a resend of a grant) or probe (the one call
    that tries a vendor whose circuit was open)."""

    kind: str


@dataclass(frozen=True, slots=True)
class NotYet:
    """No permit now: ask again after `delay_ms`; `reason` is rate | slots | tenant_rate |
    tenant_slots (waiting in line) or paused | open (until `until_ms`)."""

    delay_ms: int
    reason: str
    until_ms: int = 0


@dataclass(frozen=True, slots=True)
class BreakerState:
    state: str  # closed | open
    open_until_ms: int
    failures: int
    opened: bool  # this report opened (or re-opened) the circuit


@dataclass(frozen=True, slots=True)
class LaneState:
    """What the lane looks like now (metrics, the admin view)."""

    slots_held: int
    waiting: int
    paused_until_ms: int
    breaker: str
    open_until_ms: int


def new_permit_id() -> str:
    return secrets.token_hex(8)


class VendorLane:
    """One vendor's lane, as one process uses it."""

    def __init__(self, redis: Redis, config: VendorConfig, prefix: str = "splatq") -> None:
        self.redis = redis
        self.config = config
        self.keys = VendorKeys(config.name, prefix)
        self.limits = lane_limits(config.limits)
        self.breaker_config: BreakerConfig = config.breaker
        self._scripts = LaneScripts(redis)

    def _tenant(self, tenant: str) -> str:
        limited = self.limits.tenant_concurrency or self.limits.tenant_interval_ms
        return tenant if limited else ""

    async def acquire(self, member: str, tenant: str, permit: str, ticket: int) -> Permit | NotYet:
        """Try once for a permit (see acquire.lua); the caller sleeps `delay_ms` on NotYet.
        `ticket` orders the line (the job's creation time: older jobs first)."""
        k, lim = self.keys, self.limits
        t_slots, t_rate = k.tenant_keys(self._tenant(tenant))
        reply = await self._scripts.run(
            LaneScript.ACQUIRE,
            [k.slots, t_slots, k.holders, k.rate, t_rate, k.waiting, k.seen, k.pause, k.breaker],
            [
                member,
                permit,
                ticket,
                lim.concurrency,
                lim.tenant_concurrency,
                f"{lim.interval_ms:.3f}",
                f"{lim.tau_ms:.3f}",
                f"{lim.tenant_interval_ms:.3f}",
                f"{lim.tenant_tau_ms:.3f}",
                lim.slot_ttl_ms,
                WAITER_STALE_MS,
                SLOT_POLL_MS,
            ],
        )
        kind = str(reply[0])
        if kind == "ok":
            return Permit(str(reply[1]))
        if kind == "wait":
            return NotYet(int(reply[1]), str(reply[2]))
        until = int(reply[1])
        return NotYet(0, kind, until)

    async def hold(self, member: str, tenant: str, *, adopt: bool = False) -> bool:
        """Renew a held slot (False: it was gone), or adopt one for a prediction that runs
        at the vendor already (taken even past the limit: the vendor counts it)."""
        tenant = self._tenant(tenant)
        t_slots, _ = self.keys.tenant_keys(tenant)
        limited = "1" if self.limits.tenant_concurrency else "0"
        mode = "adopt" if adopt else "renew"
        reply = await self._scripts.run(
            LaneScript.HOLD,
            [self.keys.slots, t_slots],
            [member, self.limits.slot_ttl_ms, limited, mode],
        )
        return int(reply) == 1

    async def release(self, member: str, tenant: str) -> bool:
        k = self.keys
        t_slots, _ = k.tenant_keys(self._tenant(tenant))
        reply = await self._scripts.run(
            LaneScript.RELEASE,
            [k.slots, t_slots, k.holders, k.waiting, k.seen, k.breaker],
            [member],
        )
        return int(reply) == 1

    async def report(
        self, outcome: str, member: str, report_id: str, pause_until_ms: int = 0
    ) -> BreakerState:
        """Tell the lane what the vendor answered one call: success | failure | slow_down."""
        b, k = self.breaker_config, self.keys
        reply = await self._scripts.run(
            LaneScript.REPORT,
            [k.breaker, k.pause, k.rate, k.reported(report_id)],
            [
                outcome,
                member,
                b.failures,
                round(b.open_s * 1000),
                round(b.open_cap_s * 1000),
                pause_until_ms,
                REPORT_MARKER_TTL_MS,
            ],
        )
        return BreakerState(str(reply[0]), int(reply[1]), int(reply[2]), str(reply[3]) == "1")

    async def state(self) -> LaneState:
        k = self.keys
        pipe = self.redis.pipeline(transaction=False)
        pipe.zcard(k.slots)
        pipe.zcard(k.waiting)
        pipe.get(k.pause)
        pipe.hmget(k.breaker, ["state", "open_until"])
        slots, waiting, pause, breaker = await pipe.execute()
        return LaneState(
            slots_held=int(slots),
            waiting=int(waiting),
            paused_until_ms=int(float(pause or 0)),
            breaker=breaker[0] or "closed",
            open_until_ms=int(breaker[1] or 0),
        )
