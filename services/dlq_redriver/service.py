"""The redriver process: the scheduler (policy sweeps and maintenance tasks) plus a sampler
that exports what every replica should show alike (task successes, dead-letter depth), read
from Redis. Wiring only; the work is in splatq.shared.maintenance."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time

import structlog

from splatq.shared.engine.queue import JobQueue
from splatq.shared.maintenance.config import RedriverConfig
from splatq.shared.maintenance.deadletters import DeadLetterBook
from splatq.shared.maintenance.keys import MaintenanceKeys
from splatq.shared.maintenance.metrics import RedriverMetrics
from splatq.shared.maintenance.scheduler import RunResult, Scheduler
from splatq.shared.maintenance.store import TaskStore
from splatq.shared.maintenance.summary import DeadLetterSummary
from splatq.shared.maintenance.tasks import build_tasks
from splatq.shared.settings import Settings
from splatq.shared.storage.store import open_storage

log = structlog.get_logger("splatq.redriver")
SAMPLE_INTERVAL_S = 5.0


def holder_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def task_store(queue: JobQueue) -> TaskStore:
    return TaskStore(queue.redis, queue.scripts, MaintenanceKeys(queue.keys))


def build_scheduler(
    queue: JobQueue,
    settings: Settings,
    config: RedriverConfig,
    metrics: RedriverMetrics | None = None,
    holder: str = "",
) -> Scheduler:
    holder = holder or holder_name()
    storage = open_storage(
        settings.storage_url, settings.storage_root, s3_endpoint_url=settings.s3_endpoint_url
    )
    tasks = build_tasks(queue, storage, config, holder, metrics)

    def on_result(result: RunResult) -> None:
        if metrics is not None:
            metrics.task_runs.labels(result.task, result.outcome.value).inc()

    return Scheduler(
        task_store(queue),
        tasks,
        holder,
        settings.task_lock_ttl_ms,
        settings.task_poll_ms / 1000,
        on_result,
    )


class Redriver:
    def __init__(
        self, queue: JobQueue, settings: Settings, config: RedriverConfig, metrics: RedriverMetrics
    ) -> None:
        self.queue = queue
        self.metrics = metrics
        self.scheduler = build_scheduler(queue, settings, config, metrics)
        self.book = DeadLetterBook(queue)
        self._stop = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()
        self.scheduler.stop()

    async def run(self) -> None:
        await self.queue.setup()  # scripts, and the groups the tasks inspect
        log.info("redriver.started", holder=self.scheduler.holder,
                 tasks=sorted(self.scheduler.tasks))  # fmt: skip
        sampler = asyncio.create_task(self._sample())
        try:
            await self.scheduler.run_forever()
        finally:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
            log.info("redriver.stopped")

    async def _sample(self) -> None:
        while not self._stop.is_set():
            try:
                await self.sample_once()
            except Exception:
                log.warning("redriver.sample_failed", exc_info=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), SAMPLE_INTERVAL_S)

    async def sample_once(self) -> None:
        now = time.time()
        store = self.scheduler.store
        for name, task in self.scheduler.tasks.items():
            state = await store.state(name)
            self.metrics.task_last_success.labels(name).set(state.last_success_ms / 1000)
            self.metrics.task_interval.labels(name).set(task.schedule.interval_s(now))
        summary = await DeadLetterSummary.load(self.book)
        if summary.at_ms:
            self.metrics.dead_letter_depth.clear()
            self.metrics.dead_letter_oldest_age.clear()
            for (kind, reason), (count, age) in summary.ages_s(int(now * 1000)).items():
                self.metrics.dead_letter_depth.labels(kind, reason).set(count)
                self.metrics.dead_letter_oldest_age.labels(kind, reason).set(age)
