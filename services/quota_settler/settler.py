"""Charges and releases GPU-quota reservations from the job events in the outbox.

A job's keys (partition slot) and its tenant's quota (tenant slot) are in different cluster
slots, so no one script can finish a job and charge its tenant. The outbox already carries
every terminal event, so the saga's later steps follow it: this settler reads each
partition's events stream in its own consumer group, applies the step each event calls for
(shared/tenants/charging.py: charge the job's metered units, or waive), and only then
acknowledges. A settler
killed anywhere re-reads what it had not acknowledged (another one takes it over after
SPLATQ_QUOTA_RECLAIM_IDLE_MS), and every step is a no-op the second time (the job's saga
ledger), so nothing is charged or refunded twice.

The sweeper closes the gaps the stream can leave: a reservation whose submission never made
its job (a gateway killed mid-request), or whose terminal event was trimmed before it was
read, or whose job record has expired, is settled or released from the job's record once it
is older than SPLATQ_QUOTA_SWEEP_GRACE_S.

What is charged is the work the job's record says its runs metered (shared/engine/metering.py),
read when the event is handled: the units only grow until the job ends, a terminal event is
the last word of its run, and each unit is charged once however often it is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Callable, Mapping
from enum import StrEnum

import orjson
import structlog
from redis.exceptions import RedisError, ResponseError

from splatq.shared.backoff import Backoff
from splatq.shared.engine.ids import is_job_id, partition_of
from splatq.shared.engine.metering import metered_units
from splatq.shared.engine.queue import JobQueue
from splatq.shared.tenants.charging import Verdict, verdict_for_event, verdict_for_status
from splatq.shared.tenants.quota import QuotaBook, ReleaseReason, StepResult

log = structlog.get_logger("splatq.quota_settler")

SETTLER_GROUP = "quota-settler"
BATCH = 100
BLOCK_MS = 500
RETRY_MAX_S = 5.0
STOP_WAIT_S = 5.0


class Boundary(StrEnum):
    """The points between a batch's steps (tests kill the process at each)."""

    READ = "read"  # events read (pending in the group), no step applied
    APPLIED = "applied"  # every step applied, nothing acknowledged
    ACKED = "acked"  # acknowledged


def error_code_of(payload: str) -> str:
    """The error code a failed event carries (`data.error_code`)."""
    try:
        value = orjson.loads(payload)["data"]["error_code"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return ""
    return value if isinstance(value, str) else ""


class Settler:
    def __init__(
        self,
        queue: JobQueue,
        book: QuotaBook,
        consumer: str = "",
        on_boundary: Callable[[Boundary], None] | None = None,
    ) -> None:
        self.queue = queue
        self.book = book
        self.settings = queue.settings
        self.consumer = consumer or f"settler-{socket.gethostname()}-{os.getpid()}"
        self.on_boundary = on_boundary or (lambda _b: None)
        self._stopping = asyncio.Event()

    def stop(self) -> None:
        self._stopping.set()

    async def setup(self) -> None:
        for partition in range(self.settings.partitions):
            try:
                await self.queue.redis.xgroup_create(
                    self.queue.keys.events(partition), SETTLER_GROUP, id="0", mkstream=True
                )
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    async def run(self) -> None:
        await self.setup()
        loops = [
            asyncio.create_task(self._loop(f"settle.{p}", lambda p=p: self.step(p)))  # type: ignore[misc]
            for p in range(self.settings.partitions)
        ]
        loops.append(asyncio.create_task(self._loop("sweep", self._sweep_then_wait)))
        log.info("settler.started", consumer=self.consumer)
        await self._stopping.wait()
        # Each loop ends after its current batch (a blocking read lasts BLOCK_MS at most);
        # one still busy after that is canceled: its events stay pending, read again later.
        _, busy = await asyncio.wait(loops, timeout=STOP_WAIT_S)
        for t in busy:
            t.cancel()
        for t in loops:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        log.info("settler.stopped")

    async def _loop(self, name: str, once: Callable[[], object]) -> None:
        backoff = Backoff(cap_s=RETRY_MAX_S)
        while not self._stopping.is_set():
            try:
                await once()  # type: ignore[misc]
                backoff.reset()
            except asyncio.CancelledError:
                raise
            except (RedisError, OSError) as exc:
                log.warning("settler.redis_error", loop=name, error=type(exc).__name__)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), backoff.next())

    async def _sweep_then_wait(self) -> None:
        await self.sweep()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), self.settings.quota_sweep_interval_s)

    # -- the events -----------------------------------------------------------------------

    async def step(self, partition: int, block_ms: int = BLOCK_MS) -> int:
        """One batch of one partition: events a dead settler left pending, else new ones;
        apply their steps, then acknowledge. Returns how many events were handled."""
        redis = self.queue.redis
        stream = self.queue.keys.events(partition)
        reply = await redis.xautoclaim(
            stream,
            SETTLER_GROUP,
            self.consumer,
            self.settings.quota_reclaim_idle_ms,
            start_id="0-0",
            count=BATCH,
        )
        entries = [(eid, dict(f)) for eid, f in reply[1] if f is not None]
        if not entries:
            fresh = await redis.xreadgroup(
                SETTLER_GROUP, self.consumer, {stream: ">"}, count=BATCH, block=block_ms
            )
            for _, items in fresh or []:
                entries.extend((eid, dict(f)) for eid, f in items)
        if not entries:
            return 0
        self.on_boundary(Boundary.READ)
        for _, fields in entries:
            await self.apply(fields)
        self.on_boundary(Boundary.APPLIED)
        await redis.xack(stream, SETTLER_GROUP, *(eid for eid, _ in entries))
        self.on_boundary(Boundary.ACKED)
        return len(entries)

    async def apply(self, fields: Mapping[str, str]) -> StepResult | None:
        """The saga step one job event calls for (None: the event calls for none)."""
        tenant, job_id = fields.get("tenant", ""), fields.get("job_id", "")
        if not tenant or not is_job_id(job_id):
            return None
        code = error_code_of(fields.get("payload", "")) if fields.get("type") else ""
        decided = verdict_for_event(
            fields.get("type", ""), code, self.settings.quota_charged_failure_codes
        )
        if decided is None:
            return None
        verdict, outcome = decided
        if verdict is Verdict.CHARGE:
            result = await self.book.charge(tenant, job_id, await self._units(job_id), outcome)
        else:
            result = await self.book.release(tenant, job_id, ReleaseReason.FAILED)
        if result.done:
            log.info("quota.step", step=result.step.value, job_id=job_id, tenant=tenant,
                     amount_ms=result.amount_ms, detail=result.detail)  # fmt: skip
        return result

    async def _units(self, job_id: str) -> dict[str, int]:
        """The job's metered units of work (shared/engine/metering.py)."""
        if partition_of(job_id) >= self.settings.partitions:
            return {}
        raw = await self.queue.redis.hgetall(self.queue.keys.job(job_id))  # type: ignore[misc]
        return metered_units(raw)

    # -- the sweep ------------------------------------------------------------------------

    async def sweep(self, grace_s: float | None = None) -> int:
        """Charge or release every reservation older than the grace whose job has ended (or
        is gone). Returns how many steps it applied."""
        grace_ms = (self.settings.quota_sweep_grace_s if grace_s is None else grace_s) * 1000
        cutoff = time.time() * 1000 - grace_ms
        applied = 0
        for tenant in await self.book.quota_tenants():
            for job_id, (_, _, at_ms) in (await self.book.open_reservations(tenant)).items():
                if at_ms > cutoff:
                    continue
                status, code, units = await self._job_state(job_id)
                decided = verdict_for_status(
                    status, code, self.settings.quota_charged_failure_codes
                )
                if decided is None:
                    continue
                verdict, outcome = decided
                if verdict is Verdict.CHARGE:
                    result = await self.book.charge(tenant, job_id, units, outcome)
                else:
                    reason = ReleaseReason.EXPIRED if status is None else ReleaseReason.FAILED
                    result = await self.book.release(tenant, job_id, reason)
                if result.done:
                    applied += 1
                    log.info("quota.swept", step=result.step.value, job_id=job_id, tenant=tenant,
                             amount_ms=result.amount_ms, detail=result.detail)  # fmt: skip
        return applied

    async def _job_state(self, job_id: str) -> tuple[str | None, str, dict[str, int]]:
        if not is_job_id(job_id) or partition_of(job_id) >= self.settings.partitions:
            return None, "", {}
        raw = await self.queue.redis.hgetall(self.queue.keys.job(job_id))  # type: ignore[misc]
        if not raw:
            return None, "", {}
        return raw.get("status"), raw.get("error_code", ""), metered_units(raw)
