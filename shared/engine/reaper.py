"""The reaper: finds stream entries whose worker stopped heartbeating and takes them over.

XAUTOCLAIM pages (cursor until `0-0`) with min-idle = the lease TTL; each claimed entry's
fate is then decided by its job's lease in reclaim.lua, never by idle time alone. It does
not run jobs: it hands the entries it took to the worker that called it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

from splatq.shared.engine.entries import UNKNOWN_JOB, entry_problem
from splatq.shared.engine.keys import StreamName
from splatq.shared.engine.metrics import EngineMetrics
from splatq.shared.engine.queue import JobQueue, StreamEntry
from splatq.shared.engine.replies import Reply

log = structlog.get_logger("splatq.reaper")


@dataclass(slots=True)
class _Sweep:
    cursor: str = "0-0"
    due_at: float = 0.0


@dataclass(slots=True)
class Reaper:
    """Per-(partition, stream) sweep state for one worker."""

    queue: JobQueue
    consumer: str
    interval_s: float
    metrics: EngineMetrics | None = None
    # The calling worker's own running entries: left alone (its heartbeat keeps them).
    running_here: Callable[[StreamEntry], bool] = lambda _entry: False
    _sweeps: dict[tuple[int, StreamName], _Sweep] = field(default_factory=dict)

    def is_due(self, partition: int, stream: StreamName) -> bool:
        sweep = self._sweeps.setdefault((partition, stream), _Sweep())
        return time.monotonic() >= sweep.due_at

    async def reap_stale_entries(
        self, partition: int, stream: StreamName, capacity: int
    ) -> list[StreamEntry]:
        """Take over at most `capacity` abandoned entries; the caller must start them now.

        A sweep that ran out of capacity keeps its cursor and stays due, so the next call
        continues where this one stopped.
        """
        sweep = self._sweeps.setdefault((partition, stream), _Sweep())
        taken: list[StreamEntry] = []
        while len(taken) < capacity:
            cursor, claimed, deleted = await self.queue.autoclaim(
                partition, stream, self.consumer, sweep.cursor, capacity - len(taken)
            )
            sweep.cursor = cursor
            if deleted:
                await self._alarm_lost(partition, stream, deleted)
            taken.extend(await self._decide(claimed))
            if cursor == "0-0":
                sweep.due_at = time.monotonic() + self.interval_s
                break
        return taken

    async def _decide(self, claimed: list[StreamEntry]) -> list[StreamEntry]:
        valid: list[StreamEntry] = []
        for entry in claimed:
            problem = entry_problem(entry.fields, entry.partition)
            if problem is None and self.running_here(entry):
                log.info(
                    "entry.still_running_here",
                    job_id=entry.fields["job"],
                    stream=entry.stream.value,
                    entry_id=entry.entry_id,
                )
            elif problem is None:
                valid.append(entry)
            else:
                await self.dead_letter_entry(entry, *problem)
        taken: list[StreamEntry] = []
        outcomes = await self.queue.reclaim_many(valid)
        for entry, (outcome, detail) in zip(valid, outcomes, strict=True):
            self._count(entry, outcome, detail)
            if outcome == Reply.TAKE:
                taken.append(entry)
                cause, _, charge = detail.partition(" ")
                log.warning(
                    "job.reclaimed",
                    job_id=entry.fields["job"],
                    stream=entry.stream.value,
                    entry_id=entry.entry_id,
                    cause=cause,
                    charge=charge,
                )
            elif outcome == Reply.OUTAGE_GRACE:
                # The lease key lapsed during time nobody could reach Redis: not the holder's
                # fault. It stays with its holder, who renews it once it can.
                log.info(
                    "lease.outage_grace",
                    job_id=entry.fields["job"],
                    stream=entry.stream.value,
                    grace_ms=detail,
                )
            elif outcome == Reply.DEAD_LETTERED:
                log.error(
                    "job.dead_lettered",
                    job_id=entry.fields["job"],
                    stream=entry.stream.value,
                    reason="max_deliveries_exceeded",
                    deliveries=detail,
                )
            elif outcome == Reply.UNKNOWN:
                await self.dead_letter_entry(entry, UNKNOWN_JOB, "no job record for this entry")
        return taken

    def _count(self, entry: StreamEntry, outcome: str, detail: str) -> None:
        """Metrics of one reclaim decision: its outcome, the lapse's cause (see reclaim.lua)
        and the job's delivery charge after a death."""
        if self.metrics is None:
            return
        stream = entry.stream.value
        self.metrics.reclaims.labels(stream, outcome).inc()
        if outcome == Reply.TAKE:
            cause, _, charge = detail.partition(" ")
            self.metrics.lease_lapses.labels(stream, cause).inc()
            if cause != "stale":
                self.metrics.delivery_charge.observe(float(charge or 0))
        elif outcome == Reply.OUTAGE_GRACE:
            self.metrics.lease_lapses.labels(stream, "redis_outage").inc()
        elif outcome == Reply.DEAD_LETTERED:
            self.metrics.dead_letters.labels(stream, "max_deliveries_exceeded").inc()

    async def dead_letter_entry(self, entry: StreamEntry, reason: str, detail: str) -> None:
        """Move an entry nobody can process to the dead-letter stream, counted and logged
        (the worker's fetch path uses this too)."""
        await self.queue.dead_letter_entry(entry, reason, detail)
        if self.metrics is not None:
            self.metrics.dead_letters.labels(entry.stream.value, reason).inc()
        log.error(
            "entry.dead_lettered",
            stream=entry.stream.value,
            entry_id=entry.entry_id,
            reason=reason,
            detail=detail,
        )

    async def _alarm_lost(self, partition: int, stream: StreamName, deleted: list[str]) -> None:
        # Pending work vanished from the stream (trimmed before it was acked): the jobs'
        # records still exist, but their entries do not. This must never happen with
        # XDEL-on-ack and a generous MAXLEN; it is an operator's page, not a log line.
        await self.queue.record_lost_entries(partition, len(deleted))
        if self.metrics is not None:
            self.metrics.entries_lost_alarm.labels(stream.value).inc(len(deleted))
        log.critical(
            "stream.entries_lost",
            stream=stream.value,
            partition=partition,
            count=len(deleted),
            entry_ids=deleted[:20],
        )
