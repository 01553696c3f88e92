"""The GPU-quota saga's steps on Redis: reserve (at submission), charge (the job ended in a way
its tenant pays for: charge each metered unit of its work once, give back the reservation) and
release (the compensation: the submission was refused, or the job's end is waived).

Each step is one script in the tenant's slot and is recorded in the job's saga ledger there;
a step that happened already is a no-op, so retries, redelivered events and a process killed
at any point never charge or refund twice. Which step a job's end calls for is pure policy
(shared/tenants/charging.py).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from redis.asyncio import Redis

from splatq.shared.tenants.keys import TenantKeys
from splatq.shared.tenants.periods import Period, window
from splatq.shared.tenants.scripts import TenantScript, TenantScripts

SAGA_TTL_MS = 40 * 24 * 3600 * 1000
# A period's usage is kept this long after the period ended (late charges, reports).
USAGE_TTL_MS = 40 * 24 * 3600 * 1000
# The saga ledger's record of each unit of work it charged: `u.<unit>` = ms.
CHARGED_UNIT_PREFIX = "u."


class SagaStep(StrEnum):
    RESERVE = "reserve"
    CHARGE = "charge"
    RELEASE = "release"


class ReleaseReason(StrEnum):
    REFUSED = "refused"  # the submission did not create the job (duplicate, overloaded)
    FAILED = "failed"  # a failure the platform caused (waived)
    EXPIRED = "expired"  # the job's record is gone (the sweeper)


@dataclass(frozen=True, slots=True)
class Usage:
    tenant: str
    period: Period
    period_id: str
    limit_ms: int | None
    reserved_ms: int
    used_ms: int
    resets_ms: int

    @property
    def remaining_ms(self) -> int | None:
        if self.limit_ms is None:
            return None
        return max(0, self.limit_ms - self.reserved_ms - self.used_ms)


@dataclass(frozen=True, slots=True)
class Reservation:
    outcome: str  # reserved | exists | exceeded
    amount_ms: int
    usage: Usage

    @property
    def granted(self) -> bool:
        return self.outcome != "exceeded"


@dataclass(frozen=True, slots=True)
class StepResult:
    step: SagaStep
    done: bool  # False: a no-op (done before, or nothing to do)
    detail: str
    amount_ms: int = 0


class QuotaBook:
    def __init__(self, redis: Redis, keys: TenantKeys | None = None) -> None:
        self.redis = redis
        self.keys = keys or TenantKeys()
        self.scripts = TenantScripts(redis)
        self._noted: set[str] = set()

    def _periods(self, tenant: str, now_ms: int) -> tuple[list[str], list[str | int]]:
        day, month = window(Period.DAY, now_ms), window(Period.MONTH, now_ms)
        keys = [self.keys.usage(tenant, day.id), self.keys.usage(tenant, month.id)]
        return keys, [day.id, month.id, day.resets_ms, month.resets_ms]

    async def reserve(self, tenant: str, job_id: str, amount_ms: int) -> Reservation:
        """Step 1: hold `amount_ms` for the job, or answer `exceeded` (nothing written)."""
        usage_keys, periods = self._periods(tenant, int(time.time() * 1000))
        reply = await self.scripts.run(
            TenantScript.QUOTA_RESERVE,
            [
                self.keys.quota(tenant),
                self.keys.reservations(tenant),
                self.keys.saga(tenant, job_id),
                *usage_keys,
            ],
            [job_id, amount_ms, *periods, SAGA_TTL_MS, USAGE_TTL_MS],
        )
        return Reservation(reply[0], amount_ms, _usage(tenant, reply[1:]))

    async def release(self, tenant: str, job_id: str, reason: ReleaseReason) -> StepResult:
        """The compensation: give the job's open reservation back, charging nothing."""
        reply = await self.scripts.run(
            TenantScript.QUOTA_RELEASE,
            [self.keys.reservations(tenant), self.keys.saga(tenant, job_id)],
            [job_id, reason.value, SAGA_TTL_MS],
        )
        if reply[0] == "released":
            return StepResult(SagaStep.RELEASE, True, reason.value, int(reply[1]))
        return StepResult(SagaStep.RELEASE, False, reply[1])

    async def charge(
        self, tenant: str, job_id: str, units: Mapping[str, int], outcome: str
    ) -> StepResult:
        """Charge each of the job's metered `units` (unit -> ms) not charged yet, and close its
        reservation if open. `amount_ms` is what was charged now."""
        usage_keys, _ = self._periods(tenant, int(time.time() * 1000))
        args: list[str | int] = [job_id, outcome, SAGA_TTL_MS, USAGE_TTL_MS]
        for unit, ms in sorted(units.items()):
            args += [unit, max(0, int(ms))]
        reply = await self.scripts.run(
            TenantScript.QUOTA_CHARGE,
            [
                self.keys.reservations(tenant),
                self.keys.saga(tenant, job_id),
                self.keys.quota(tenant),
                *usage_keys,
            ],
            args,
        )
        if reply[0] == "charged":
            detail = f"{outcome}: reservation {reply[2]} ms closed, {reply[3]} ms charged in all"
            return StepResult(SagaStep.CHARGE, True, detail, int(reply[1]))
        return StepResult(SagaStep.CHARGE, False, reply[1])

    async def charged_units(self, tenant: str, job_id: str) -> dict[str, int]:
        """The units of work the job's ledger charged: unit -> ms."""
        ledger = await self.ledger(tenant, job_id)
        n = len(CHARGED_UNIT_PREFIX)
        return {k[n:]: int(v) for k, v in ledger.items() if k.startswith(CHARGED_UNIT_PREFIX)}

    async def usage(self, tenant: str) -> Usage:
        now = int(time.time() * 1000)
        raw = await self.redis.hmget(self.keys.quota(tenant), ["gpu_ms", "period"])  # type: ignore[misc]
        period = Period.DAY if raw[1] == "day" else Period.MONTH
        w = window(period, now)
        used = await self.redis.hmget(  # type: ignore[misc]
            self.keys.usage(tenant, w.id), ["reserved_ms", "used_ms"]
        )
        return Usage(
            tenant,
            period,
            w.id,
            int(raw[0]) if raw[0] else None,
            max(0, int(used[0] or 0)),
            int(used[1] or 0),
            w.resets_ms,
        )

    async def ledger(self, tenant: str, job_id: str) -> dict[str, str]:
        """The job's saga ledger: step -> `at_ms|amount_ms|detail`, `charged_ms`, and
        `u.<unit>` -> ms for each unit of work it charged."""
        return dict(await self.redis.hgetall(self.keys.saga(tenant, job_id)))  # type: ignore[misc]

    async def open_reservations(self, tenant: str) -> dict[str, tuple[str, int, int]]:
        """job_id -> (period_id, amount_ms, reserved_at_ms) of every open reservation."""
        raw = await self.redis.hgetall(self.keys.reservations(tenant))  # type: ignore[misc]
        out = {}
        for job_id, value in raw.items():
            pid, amount, at = value.split("|")
            out[job_id] = (pid, int(amount), int(at))
        return out

    async def note_tenant(self, tenant: str) -> None:
        """Put the tenant on the sweeper's list (once per process is enough)."""
        await self.redis.sadd(self.keys.quota_tenants, tenant)  # type: ignore[misc]

    async def note_tenant_once(self, tenant: str) -> None:
        """`note_tenant`, once per tenant and QuotaBook (the set only grows)."""
        if tenant not in self._noted:
            await self.note_tenant(tenant)
            self._noted.add(tenant)

    async def quota_tenants(self) -> list[str]:
        return sorted(await self.redis.smembers(self.keys.quota_tenants))  # type: ignore[misc]


def _usage(tenant: str, reply: list[str]) -> Usage:
    limit, reserved, used, reset, pid = reply[:5]
    period = Period.DAY if pid.startswith("d") else Period.MONTH
    return Usage(
        tenant,
        period,
        pid,
        None if int(limit) < 0 else int(limit),
        int(reserved),
        int(used),
        int(reset),
    )
