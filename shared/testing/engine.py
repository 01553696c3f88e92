"""The engine in one test process: settings with short leases and intervals, workers started
as asyncio tasks and always stopped, and waits on a job's observable state."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from redis.asyncio import Redis

from splatq.shared.engine.job_context import JobHandler
from splatq.shared.engine.jobs import JobRecord
from splatq.shared.engine.queue import JobQueue
from splatq.shared.engine.runner import stop_when_drained
from splatq.shared.engine.worker import Worker
from splatq.shared.settings import Settings
from splatq.shared.testing.poll import DEFAULT_TIMEOUT_S, eventually


def engine_settings(redis_url: str, **overrides: Any) -> Settings:
    """Settings for tests: short leases and intervals, so crash recovery takes about a second,
    not minutes (lease 900 ms, reaper every 200 ms, retries after 20-100 ms, 3 attempts)."""
    base = Settings(
        redis_url=redis_url,
        lease_ttl_ms=900,
        reaper_interval_ms=200,
        retry_base_ms=20,
        retry_cap_ms=100,
        worker_concurrency=4,
        fetch_block_ms=100,
        shutdown_grace_s=3.0,
        max_deliveries=3,
        max_attempts=3,
    )
    return base.with_overrides(**overrides)


async def finish_or_cancel(task: asyncio.Task[None], timeout_s: float = 15.0) -> None:
    """Wait for a stopped service's task to end; cancel it if it does not in time."""
    try:
        await asyncio.wait_for(task, timeout=timeout_s)
    except TimeoutError:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


class _Running:
    """Services started as tasks of this loop (`stop()` then `run()` ends), all stopped by
    `stop_all()`."""

    def __init__(self) -> None:
        self.started: list[tuple[Any, asyncio.Task[None]]] = []

    def _run(self, service: Any) -> None:
        self.started.append((service, asyncio.create_task(service.run())))

    def _timeout_s(self, service: Any) -> float:
        return 15.0

    async def stop_all(self) -> None:
        for service, _ in self.started:
            service.stop()
        for service, task in self.started:
            await finish_or_cancel(task, timeout_s=self._timeout_s(service))
        self.started.clear()


WorkerFactory = Callable[..., Awaitable[Worker]]


class InProcessWorkers(_Running):
    """`await workers.start(handler, **settings_overrides)`: a `Worker` (with its own
    `JobQueue`) running as a task on `redis`; `await workers.stop_all()` stops every one.
    `start` is a `WorkerFactory`; `default_handler` serves when `start` gets none."""

    def __init__(
        self, redis: Redis, settings: Settings, default_handler: JobHandler | None = None
    ) -> None:
        super().__init__()
        self.redis, self.settings, self.default_handler = redis, settings, default_handler

    async def start(self, handler: JobHandler | None = None, **overrides: Any) -> Worker:
        handler = handler or self.default_handler
        if handler is None:
            raise TypeError("InProcessWorkers.start needs a handler (no default_handler)")
        s = self.settings.with_overrides(**overrides)
        worker = Worker(JobQueue(self.redis, s), s, handler)
        self._run(worker)
        return worker

    def _timeout_s(self, service: Any) -> float:
        # A stopped worker ends after its blocking read returns; a test that chose a long
        # block (an idle worker's wake-up) has nothing left for it to do: cancel sooner.
        return 1.0 if service.settings.fetch_block_ms > 5_000 else 15.0


StagesFactory = Callable[..., Awaitable[list[Any]]]


class StagedWorkers(_Running):
    """`await staged.start(handlers, stages="all", **settings_overrides)`: one fleet member
    as a staged process runs it: a `Worker` per job stage given (on that stage's streams, with
    its own queue; `handlers.handler(stage)` serves it) and the cleanup consumer
    (`handlers.cleanup`) when `cleanup` is given. Returns the started workers; `stop_all()`
    stops them. `start` is a `StagesFactory`."""

    def __init__(self, redis: Redis, settings: Settings) -> None:
        super().__init__()
        self.redis, self.settings = redis, settings

    async def start(
        self, handlers: Any, stages: str | Iterable[Any] = "all", **overrides: Any
    ) -> list[Any]:
        from splatq.shared.engine.cleanup import CleanupWorker  # noqa: PLC0415
        from splatq.shared.engine.fleet import FleetMember  # noqa: PLC0415
        from splatq.shared.engine.stages import (  # noqa: PLC0415
            PIPELINE,
            PipelineStage,
            parse_stage_list,
        )

        chosen = parse_stage_list(stages) if isinstance(stages, str) else tuple(stages)
        s = self.settings.with_overrides(**overrides)
        out: list[Any] = []
        member = FleetMember()
        for stage in chosen:
            if stage in PIPELINE:
                q = JobQueue(self.redis, s).for_stage(stage)
                w: Any = Worker(q, s.for_stage(stage.value), handlers.handler(stage), member=member)
            elif stage is PipelineStage.CLEANUP:
                q = JobQueue(self.redis, s)
                w = CleanupWorker(q, handlers.cleanup, consumer=member.name, claim_idle_ms=1000)
            else:
                continue
            self._run(w)
            out.append(w)
        return out


async def wait_for_status(
    queue: JobQueue,
    job_id: str,
    statuses: set[str],
    timeout: float = DEFAULT_TIMEOUT_S,  # noqa: ASYNC109 - a test's bound, as `eventually`'s
) -> JobRecord:
    """Until the job's status is one of `statuses` (`"completed"`, `"failed"`, ...); returns
    the job then. On timeout the `AssertionError` shows the job as last read."""
    last: list[JobRecord | None] = [None]

    async def reached() -> JobRecord | None:
        last[0] = job = await queue.get(job_id)
        return job if job is not None and job.status.value in statuses else None

    job = await eventually(
        reached,
        timeout,
        message=lambda: f"job {job_id} reaching {sorted(statuses)} (last read: {last[0]})",
    )
    assert job is not None  # eventually returns a truthy value
    return job


async def job_events(redis: Redis, queue: JobQueue, job_id: str) -> list[str]:
    """The event types appended for one job, in order."""
    from splatq.shared.engine.ids import partition_of  # noqa: PLC0415

    entries = await redis.xrange(queue.keys.events(partition_of(job_id)))
    return [f["type"] for _, f in entries if f.get("job_id") == job_id]


async def run_burst(worker: Worker, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Run `worker` as `splatq worker --burst` does: until nothing waits, is delayed or runs
    in its partitions (two idle looks in a row), then return. For a test whose wait is only
    "until the queue has drained": no poll of every job's status."""
    watcher = asyncio.create_task(stop_when_drained(worker.queue, worker))
    try:
        await asyncio.wait_for(worker.run(), timeout_s)
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
