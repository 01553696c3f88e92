"""The GPU-quota saga's steps on Redis: reserve (at submission), settle (the job completed:
charge its measured GPU time, give back the rest) and release (the compensation: the
submission was refused, or the job failed, was canceled, dead-lettered or expired).

Each step is one script in the tenant's slot and is recorded in the job's saga ledger there;
a step that happened already is a no-op, so retries, redelivered events and a process killed
at any point never charge or refund twice. Which step a job event calls for is pure policy
(`step_for_event`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import StrEnum

from redis.asyncio import Redis

from splatq.shared.engine.events import EventType
from splatq.shared.tenants.keys import TenantKeys
from splatq.shared.tenants.periods import Period, window
from splatq.shared.tenants.scripts import TenantScript, TenantScripts

SAGA_TTL_MS = 40 * 24 * 3600 * 1000
# A period's usage is kept this long after the period ended (late settles, reports).
USAGE_TTL_MS = 40 * 24 * 3600 * 1000


class SagaStep(StrEnum):
    RESERVE = "reserve"
    SETTLE = "settle"
    RELEASE = "release"


class ReleaseReason(StrEnum):
    REFUSED = "refused"  # the submission did not create the job (duplicate, overloaded)
    FAILED = "failed"  # includes dead-lettered jobs (they fail with code dead_lettered)
    CANCELED = "canceled"
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


def step_for_event(event_type: str) -> tuple[SagaStep, ReleaseReason | None] | None:
    """What a job event means for the job's quota: completed -> settle; failed (dead letters
    included) and canceled -> release; anything else -> nothing."""
    if event_type == EventType.COMPLETED:
        return SagaStep.SETTLE, None
    if event_type == EventType.FAILED:
        return SagaStep.RELEASE, ReleaseReason.FAILED
    if event_type == EventType.CANCELED:
        return SagaStep.RELEASE, ReleaseReason.CANCELED
    return None


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
        """The compensation: give the job's reservation back (once; never after a settle)."""
        reply = await self.scripts.run(
            TenantScript.QUOTA_RELEASE,
            [self.keys.reservations(tenant), self.keys.saga(tenant, job_id)],
            [job_id, reason.value, SAGA_TTL_MS],
        )
        if reply[0] == "released":
            return StepResult(SagaStep.RELEASE, True, reason.value, int(reply[1]))
        return StepResult(SagaStep.RELEASE, False, reply[1])

    async def settle(self, tenant: str, job_id: str, measured_ms: int) -> StepResult:
        """Step 3: charge the measured GPU time, give back the reservation (once)."""
        usage_keys, _ = self._periods(tenant, int(time.time() * 1000))
        reply = await self.scripts.run(
            TenantScript.QUOTA_SETTLE,
            [
                self.keys.reservations(tenant),
                self.keys.saga(tenant, job_id),
                self.keys.quota(tenant),
                *usage_keys,
            ],
            [job_id, max(0, int(measured_ms)), SAGA_TTL_MS, USAGE_TTL_MS],
        )
        if reply[0] == "settled":
            return StepResult(SagaStep.SETTLE, True, f"reserved {reply[2]} ms", int(reply[1]))
        return StepResult(SagaStep.SETTLE, False, reply[1])

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
        """The job's saga ledger: step -> `at_ms|amount_ms|detail`."""
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
