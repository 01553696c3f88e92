"""Every scheduled task, built from the configuration (the names are DEFAULT_SCHEDULES')."""

from __future__ import annotations

from splatq.shared.engine.queue import JobQueue
from splatq.shared.maintenance.bucket import RedriveBucket
from splatq.shared.maintenance.config import RedriverConfig
from splatq.shared.maintenance.deadletters import DeadLetterBook
from splatq.shared.maintenance.housekeeping import (
    ExpiredLeases,
    ExpireRecords,
    PruneConsumers,
    StreamBounds,
)
from splatq.shared.maintenance.metrics import RedriverMetrics
from splatq.shared.maintenance.retention import Retention
from splatq.shared.maintenance.scheduler import Task
from splatq.shared.maintenance.sweep import RedriveSweep
from splatq.shared.storage.store import Storage


def redrive_sweep(
    queue: JobQueue, config: RedriverConfig, holder: str, metrics: RedriverMetrics | None
) -> RedriveSweep:
    book = DeadLetterBook(queue)
    bucket = RedriveBucket(
        queue.scripts, book.keys.redrive_bucket(), config.rate_per_s, config.burst
    )
    on_redrive = None
    if metrics is not None:
        counter = metrics.redrives

        def on_redrive(kind: object, policy: str, outcome: str) -> None:
            counter.labels(str(kind), policy, outcome).inc()

    return RedriveSweep(
        book, config, bucket, config.tasks["redrive_sweep"].schedule, holder, on_redrive
    )


def build_tasks(
    queue: JobQueue,
    storage: Storage,
    config: RedriverConfig,
    holder: str,
    metrics: RedriverMetrics | None = None,
) -> list[Task]:
    schedules = {name: t.schedule for name, t in config.tasks.items()}
    fill = lease = deleted = None
    if metrics is not None:
        m = metrics

        def fill(stream: str, partition: int, ratio: float) -> None:
            m.stream_fill.labels(stream, str(partition)).set(ratio)

        def lease(partition: int, count: int) -> None:
            m.expired_leases.labels(str(partition)).set(count)

        def deleted(kind: str, count: int) -> None:
            m.retention_deleted.labels(kind).inc(count)

    every: list[Task] = [
        redrive_sweep(queue, config, holder, metrics),
        Retention(queue, storage, config.retention, schedules["retention"], on_deleted=deleted),
        ExpireRecords(queue, schedules["expire_records"]),
        PruneConsumers(queue, schedules["prune_consumers"]),
        StreamBounds(queue, schedules["stream_bounds"], fill),
        ExpiredLeases(queue, schedules["expired_leases"], lease),
    ]
    return [t for t in every if config.tasks[t.name].enabled]
