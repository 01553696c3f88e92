"""The worker runtime every job-running service builds on (the GPU worker first).

One process consumes both streams through the weighted slot pool, heartbeats every lease in
one pipelined call per tick, commits outcomes in batches, reaps abandoned entries, promotes
due retries and drains on SIGTERM. It knows nothing of what a job computes: that is the
handler's job.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import random
import secrets
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import orjson
import structlog
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from shared import events
from shared.entries import UNKNOWN_JOB, entry_problem
from shared.errors import CORRUPT_JOB_RECORD, ErrorInfo, JobCanceled, LeaseLost, classify
from shared.events import EventType
from shared.jobs import JobOutcome, JobRecord
from shared.keys import STREAMS, StreamName
from shared.metrics import EngineMetrics
from shared.queue import Finish, JobQueue, StreamEntry
from shared.reaper import Reaper
from shared.retries import decide_retry
from shared.settings import Settings
from shared.slots import SlotPool

log = structlog.get_logger("splatq.worker")
T = TypeVar("T")

REDIS_ERRORS = (RedisConnectionError, RedisTimeoutError, ConnectionError, OSError)
PROGRESS_EVENT_INTERVAL_S = 1.0
CONSUMER_PRUNE_IDLE_MS = 3_600_000
# How long the fetch loop waits before looking again when it cannot block (a saturated
# stream, or several partitions): bounds the start latency of newly arrived work.
IDLE_POLL_S = 0.05


class JobHandler(Protocol):
    """What the worker runs for each job. Raise `PermanentError`/`TransientError` (with a
    code) to fail or retry; call `ctx.progress()` at stage boundaries."""

    async def __call__(self, ctx: JobContext) -> JobOutcome: ...


class LifecycleHandler(JobHandler, Protocol):
    """A handler with resources to open before the first job and close after the last."""

    async def startup(self) -> None: ...

    async def shutdown(self) -> None: ...


HandlerFactory = Callable[[Settings], JobHandler]


def load_handler_factory(spec: str) -> HandlerFactory:
    """`package.module:factory` -> the factory (called with the settings)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"handler spec must be 'package.module:factory', got {spec!r}")
    factory: HandlerFactory = getattr(importlib.import_module(module_name), attr)
    return factory


@dataclass(slots=True)
class JobContext:
    """A running job as its handler sees it."""

    job: JobRecord
    entry: StreamEntry
    token: str
    queue: JobQueue
    log: Any
    cancel_requested: bool = False
    lease_lost: bool = False
    _last_event_at: float = 0.0
    _last_stage: str = ""

    @property
    def job_id(self) -> str:
        return self.job.id

    @property
    def attempt(self) -> int:
        return self.job.attempts

    @property
    def stream(self) -> StreamName:
        return self.entry.stream

    def raise_if_stopped(self) -> None:
        """Call at stage boundaries: stops a canceled job, or one whose lease was lost."""
        if self.lease_lost:
            raise LeaseLost(self.job.id)
        if self.cancel_requested:
            raise JobCanceled(self.job.id)

    async def progress(self, fraction: float, stage: str) -> None:
        """Record progress (fenced by the lease); a `progress` event at most once a second
        or on a new stage. Raises `JobCanceled`/`LeaseLost` when the job must stop."""
        self.raise_if_stopped()
        now = time.monotonic()
        emit = stage != self._last_stage or now - self._last_event_at >= PROGRESS_EVENT_INTERVAL_S
        reply = await self.queue.report_progress(
            self.job.id, self.token, min(max(fraction, 0.0), 1.0), stage, emit
        )
        if emit:
            self._last_event_at, self._last_stage = now, stage
        if reply == 0:
            self.lease_lost = True
        elif reply == 2:
            self.cancel_requested = True
        self.raise_if_stopped()

    async def run_blocking(self, fn: Callable[..., T], *args: Any) -> T:
        """Run CPU/GPU-bound work in a thread so the event loop keeps renewing leases."""
        return await asyncio.to_thread(fn, *args)


@dataclass(slots=True)
class _Running:
    ctx: JobContext
    task: asyncio.Task[None] | None = None
    # Set once the outcome is handed to the committer: from then on the commit's own fence
    # decides, and a renewal racing the commit's DEL of the lease means nothing.
    committing: bool = False
    started_at: float = field(default_factory=time.monotonic)
    renewed_at: float = field(default_factory=time.monotonic)


@dataclass(slots=True)
class _Commit:
    finish: Finish
    done: asyncio.Future[tuple[str, str]]


def new_consumer_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


class Worker:
    """Consumes the work streams of the owned partitions and runs `handler` per job."""

    def __init__(
        self,
        queue: JobQueue,
        settings: Settings,
        handler: JobHandler,
        metrics: EngineMetrics | None = None,
        consumer: str | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.queue = queue
        self.settings = settings
        self.handler = handler
        self.metrics = metrics
        self.consumer = consumer or new_consumer_name()
        self.pool = SlotPool.create(settings.worker_concurrency, settings.interactive_share)
        self.partitions = settings.owned_partitions
        self.reaper = Reaper(queue, self.consumer, settings.reaper_interval_ms / 1000, metrics)
        self._rng = rng or random.Random()
        self._running: dict[str, _Running] = {}
        self._commits: asyncio.Queue[_Commit] = asyncio.Queue()
        self._slot_freed = asyncio.Event()
        self._stopping = asyncio.Event()
        self._releasing = False
        self._rotation = 0
        self.log = log.bind(consumer=self.consumer)
        if metrics is not None:
            for s in STREAMS:
                metrics.slots_reserved.labels(s.value).set(self.pool.reserved[s])

    # -- lifecycle ---------------------------------------------------------------------

    def stop(self) -> None:
        """Graceful stop: take no new work, finish or release the running jobs."""
        self._stopping.set()

    @property
    def running_jobs(self) -> int:
        return len(self._running)

    async def run(self) -> None:
        """Run until `stop()`; then drain within the grace period and return."""
        await self.queue.setup()
        helpers = [
            asyncio.create_task(self._heartbeat_loop(), name="heartbeat"),
            asyncio.create_task(self._commit_loop(), name="committer"),
            asyncio.create_task(self._maintenance_loop(), name="maintenance"),
        ]
        self.log.info(
            "worker.started",
            partitions=list(self.partitions),
            slots={s.value: n for s, n in self.pool.reserved.items()},
        )
        try:
            await self._fetch_loop()
            await self._drain()
        finally:
            for task in helpers:
                task.cancel()
            for task in helpers:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            self.log.info("worker.stopped")

    async def _drain(self) -> None:
        tasks = [r.task for r in self._running.values() if r.task is not None]
        if tasks:
            self.log.info(
                "worker.draining", running=len(tasks), grace_s=self.settings.shutdown_grace_s
            )
            _, pending = await asyncio.wait(tasks, timeout=self.settings.shutdown_grace_s)
            if pending:
                # Past the grace period: release what is left without burning attempts.
                self._releasing = True
                for task in pending:
                    task.cancel()
                await asyncio.wait(pending)
        # Each job task awaited its own commit, so nothing is left in the committer.

    # -- fetching ----------------------------------------------------------------------

    async def _fetch_loop(self) -> None:
        while not self._stopping.is_set():
            if not self.pool.has_capacity():
                self._slot_freed.clear()
                await self._wait_or_stop(self._slot_freed.wait())
                # Jobs committed in one batch resume together: let them all release their
                # slots before fetching, so the next read and start are one batch too.
                await asyncio.sleep(0)
                continue
            try:
                await self._fetch_once()
            except REDIS_ERRORS as exc:
                self.log.warning("fetch.redis_unavailable", error=str(exc))
                await self._wait_or_stop(asyncio.sleep(0.5))

    async def _wait_or_stop(self, aw: Awaitable[Any], timeout_s: float | None = None) -> None:
        waiter = asyncio.ensure_future(aw)
        stopper = asyncio.ensure_future(self._stopping.wait())
        await asyncio.wait(
            {waiter, stopper}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
        for f in (waiter, stopper):
            f.cancel()

    async def _fetch_once(self) -> int:
        """Reap, then take new work for the free slots; when there is none, wait.
        Returns how many entries were consumed (started or disposed of)."""
        consumed = 0
        for partition in self._partition_order():
            for stream in STREAMS:
                capacity = self.pool.capacity(stream)
                if capacity and self.reaper.is_due(partition, stream):
                    taken = await self.reaper.reap_stale_entries(partition, stream, capacity)
                    consumed += len(taken)
                    await self._start(taken)
            consumed += await self._take(partition)
        if consumed or self._stopping.is_set():
            return consumed
        caps = self.pool.capacities()
        if not all(caps.values()):
            # A stream is saturated and the others have nothing to do. A blocking read on
            # the others would hold us past the saturated stream's next free slot, so wait
            # for a slot (or a short poll interval) instead.
            self._slot_freed.clear()
            await self._wait_or_stop(self._slot_freed.wait(), timeout_s=IDLE_POLL_S)
            return 0
        # Nothing anywhere and room on every stream: block on one partition for new entries
        # (one per stream; the next take reads the rest).
        block_ms = self.settings.fetch_block_ms
        if len(self.partitions) > 1:
            block_ms = min(block_ms, int(IDLE_POLL_S * 1000))
        partition = self.partitions[self._rotation % len(self.partitions)]
        return await self._start(
            await self.queue.wait_for_new(partition, STREAMS, self.consumer, block_ms)
        )

    def _partition_order(self) -> list[int]:
        self._rotation += 1
        k = self._rotation % len(self.partitions)
        return list(self.partitions[k:] + self.partitions[:k])

    async def _take(self, partition: int) -> int:
        """Read and start new entries for the free slots (take.lua: one round trip); returns
        how many entries it consumed, including duplicates and dead-lettered ones."""
        if not self.pool.has_capacity():
            return 0
        taken = await self.queue.take(
            partition, self.pool.guaranteed_counts(), self.pool.idle, self.consumer
        )
        for t in taken:
            if self.metrics is not None:
                self.metrics.deliveries.labels(t.entry.stream.value, t.outcome).inc()
            if t.outcome == "started" and t.job is not None:
                self.pool.acquire(t.entry.stream)
                self._launch(t.entry, t.token, t.job)
            elif t.outcome == "corrupt":
                await self._fail_unreadable(t.entry, t.token, t.detail)
            elif t.outcome == "raw":
                problem = entry_problem(t.entry.fields, partition)
                await self.reaper.dead_letter_entry(
                    t.entry, *(problem or (UNKNOWN_JOB, "no job record for this entry"))
                )
            else:
                self.log.info("entry.not_started", entry_id=t.entry.entry_id, outcome=t.outcome)
        return len(taken)

    async def _start(self, entries: list[StreamEntry]) -> int:
        """Lease and start delivered entries; malformed ones go to the dead-letter stream."""
        if not entries:
            return 0
        valid: list[StreamEntry] = []
        for entry in entries:
            problem = entry_problem(entry.fields, entry.partition)
            if problem is not None:
                await self.reaper.dead_letter_entry(entry, *problem)
                continue
            valid.append(entry)
            self.pool.acquire(entry.stream)
        tokens = [secrets.token_hex(12) for _ in valid]
        try:
            results = await self.queue.start_many(valid, tokens, self.consumer)
        except REDIS_ERRORS:
            # Unknown whether the scripts ran: the entries stay pending and any lease taken
            # expires, so the reaper recovers them. Only the slots are ours to give back.
            for entry in valid:
                self._release_slot(entry.stream)
            raise
        started = 0
        for entry, token, result in zip(valid, tokens, results, strict=True):
            if self.metrics is not None:
                self.metrics.deliveries.labels(entry.stream.value, result.outcome).inc()
            if result.outcome == "started" and result.job is not None:
                self._launch(entry, token, result.job)
                started += 1
                continue
            self._release_slot(entry.stream)
            if result.outcome == "corrupt":
                await self._fail_unreadable(
                    StreamEntry(
                        entry.partition,
                        entry.stream,
                        entry.entry_id,
                        {"job": entry.fields["job"], "claim": entry.fields.get("claim", "")},
                    ),
                    token,
                    result.detail,
                )
            elif result.outcome == "unknown":
                await self.reaper.dead_letter_entry(
                    entry, UNKNOWN_JOB, "no job record for this entry"
                )
            else:
                self.log.info(
                    "entry.not_started",
                    entry_id=entry.entry_id,
                    job_id=entry.fields.get("job"),
                    outcome=result.outcome,
                    detail=result.detail,
                )
        return started

    async def _fail_unreadable(self, entry: StreamEntry, token: str, detail: str) -> None:
        """A job hash this worker cannot parse fails alone (permanent), instead of crashing
        the worker on every delivery."""
        finish = Finish(
            job_id=entry.fields["job"],
            stream=entry.stream,
            entry_id=entry.entry_id,
            token=token,
            target="failed",
            claim_key=entry.fields.get("claim", ""),
            event=EventType.FAILED.value,
            event_extra=events.failed_fields(CORRUPT_JOB_RECORD, detail, False),
            claim_status="FAILED",
            fields={
                "error_code": CORRUPT_JOB_RECORD,
                "error_message": detail,
                "error_retryable": "0",
            },
        )
        await self.queue.finish_many([finish])
        self.log.error("job.unreadable", job_id=entry.fields["job"], detail=detail)

    def _release_slot(self, stream: StreamName) -> None:
        self.pool.release(stream)
        self._slot_freed.set()
        if self.metrics is not None:
            self.metrics.slots_in_use.labels(stream.value).set(self.pool.running[stream])

    # -- running one job ----------------------------------------------------------------

    def _launch(self, entry: StreamEntry, token: str, job: JobRecord) -> None:
        bound = self.log.bind(
            job_id=job.id, trace_id=job.trace_id, stream=entry.stream.value, attempt=job.attempts
        )
        ctx = JobContext(job=job, entry=entry, token=token, queue=self.queue, log=bound)
        running = _Running(ctx)
        self._running[job.id] = running
        running.task = asyncio.create_task(self._run_job(running), name=f"job:{job.id}")
        if self.metrics is not None:
            self.metrics.slots_in_use.labels(entry.stream.value).set(
                self.pool.running[entry.stream]
            )

    async def _run_job(self, running: _Running) -> None:  # noqa: PLR0912 - one outcome per exit path
        ctx = running.ctx
        structlog.contextvars.bind_contextvars(
            job_id=ctx.job.id,
            trace_id=ctx.job.trace_id,
            stream=ctx.stream.value,
            attempt=ctx.attempt,
        )
        ctx.log.debug("job.started")
        finish: Finish | None = None
        outcome_label = "lease_lost"
        try:
            try:
                outcome = await self.handler(ctx)
            except JobCanceled:
                finish, outcome_label = self._finish(ctx, "canceled"), "canceled"
            except LeaseLost:
                finish = None
            except asyncio.CancelledError:
                if ctx.lease_lost:
                    finish = None
                elif self._releasing:
                    finish = self._finish(ctx, "queued", handoff=True)
                    outcome_label = "released"
                else:
                    raise
            except Exception as exc:
                finish, outcome_label = self._failure(ctx, classify(exc), exc)
            else:
                finish, outcome_label = self._success(ctx, outcome), "completed"
            if ctx.lease_lost:
                finish, outcome_label = None, "lease_lost"
            if finish is not None:
                running.committing = True
                result, status = await self._commit(finish)
                if result == "lease_lost":
                    outcome_label = "lease_lost"
                elif result == "ok" and status == "canceled":
                    outcome_label = "canceled"
                ctx.log.info(
                    "job.finished",
                    outcome=outcome_label,
                    commit=result,
                    status=status,
                    duration_ms=round((time.monotonic() - running.started_at) * 1000),
                )
            else:
                ctx.log.warning("job.abandoned", reason="lease_lost")
        finally:
            self._running.pop(ctx.job.id, None)
            self._release_slot(ctx.stream)
            if self.metrics is not None:
                self.metrics.jobs.labels(ctx.stream.value, outcome_label).inc()
                self.metrics.job_duration.labels(ctx.stream.value, outcome_label).observe(
                    time.monotonic() - running.started_at
                )

    def _finish(self, ctx: JobContext, target: str, **kw: Any) -> Finish:
        return Finish(
            job_id=ctx.job.id,
            stream=ctx.stream,
            entry_id=ctx.entry.entry_id,
            token=ctx.token,
            target=target,
            claim_key=ctx.job.claim_key,
            **kw,
        )

    def _success(self, ctx: JobContext, outcome: JobOutcome) -> Finish:
        model = outcome.model or ctx.job.model
        compute_ms = outcome.compute_time_ms
        if compute_ms is None:
            compute_ms = round((time.monotonic() - self._running[ctx.job.id].started_at) * 1000)
        fields: dict[str, str] = {
            "artifacts": orjson.dumps(dict(outcome.artifacts)).decode(),
            "compute_time_ms": str(compute_ms),
            "model": model,
            **outcome.extra_fields,
        }
        return self._finish(
            ctx,
            "completed",
            event=EventType.COMPLETED.value,
            event_extra=events.completed_fields(model, compute_ms, outcome.artifacts),
            claim_status="COMPLETED",
            fields=fields,
        )

    def _failure(self, ctx: JobContext, info: ErrorInfo, exc: BaseException) -> tuple[Finish, str]:
        s = self.settings
        decision = decide_retry(
            info, ctx.attempt, s.max_attempts, s.retry_base_ms, s.retry_cap_ms, self._rng
        )
        error_fields: Mapping[str, str] = {
            "error_code": info.code,
            "error_message": info.message[:1000],
            "error_retryable": "1" if info.retryable else "0",
        }
        if decision.retry:
            if self.metrics is not None:
                self.metrics.retries.labels(ctx.stream.value, info.code).inc()
            ctx.log.warning(
                "job.retry_scheduled",
                code=info.code,
                error=info.message,
                delay_ms=decision.delay_ms,
            )
            return self._finish(
                ctx, "retrying", retry_delay_ms=decision.delay_ms, fields=error_fields
            ), "retrying"
        ctx.log.error(
            "job.failed",
            code=info.code,
            error=info.message,
            exc_info=exc if not info.retryable else None,
        )
        return self._finish(
            ctx,
            "failed",
            event=EventType.FAILED.value,
            event_extra=events.failed_fields(info.code, info.message, info.retryable),
            claim_status="FAILED",
            fields=error_fields,
        ), "failed"

    # -- committing ---------------------------------------------------------------------

    async def _commit(self, finish: Finish) -> tuple[str, str]:
        done: asyncio.Future[tuple[str, str]] = asyncio.get_running_loop().create_future()
        await self._commits.put(_Commit(finish, done))
        return await done

    async def _commit_loop(self) -> None:
        """Batches every outcome ready at the same moment into one round trip."""
        while True:
            batch = [await self._commits.get()]
            while not self._commits.empty() and len(batch) < 256:
                batch.append(self._commits.get_nowait())
            delay = 0.05
            while True:
                try:
                    results = await self.queue.finish_many([c.finish for c in batch])
                    break
                except REDIS_ERRORS as exc:
                    # finish.lua is idempotent for terminal targets, so resending is safe.
                    self.log.warning("commit.redis_unavailable", error=str(exc), jobs=len(batch))
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 2.0)
                except Exception as exc:
                    self.log.exception("commit.failed", jobs=len(batch))
                    results = [("error", str(exc))] * len(batch)
                    break
            for c, r in zip(batch, results, strict=True):
                if not c.done.done():
                    c.done.set_result(r)

    # -- heartbeats -----------------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        interval = self.settings.heartbeat_interval_s
        ttl_s = self.settings.lease_ttl_ms / 1000
        while True:
            await asyncio.sleep(interval)
            running = list(self._running.values())
            if not running:
                continue
            leases = [
                (r.ctx.job.id, r.ctx.stream, r.ctx.entry.entry_id, r.ctx.token) for r in running
            ]
            try:
                replies = await self.queue.renew_many(leases, self.consumer)
            except Exception as exc:
                if self.metrics is not None:
                    self.metrics.lease_renewal_failures.labels(type(exc).__name__).inc(len(running))
                self.log.warning("lease.renew_failed", error=str(exc), jobs=len(running))
                now = time.monotonic()
                for r in running:
                    if now - r.renewed_at > ttl_s:
                        self._lose_lease(r, "expired_unrenewed")
                continue
            now = time.monotonic()
            for r, reply in zip(running, replies, strict=True):
                if reply == 0:
                    self._lose_lease(r, "not_holder")
                else:
                    r.renewed_at = now
                    if reply == 2 and not r.ctx.cancel_requested:
                        r.ctx.cancel_requested = True
                        r.ctx.log.info("job.cancel_observed")

    def _lose_lease(self, running: _Running, reason: str) -> None:
        if running.ctx.lease_lost or running.committing:
            return
        running.ctx.lease_lost = True
        if self.metrics is not None:
            self.metrics.lease_renewal_failures.labels(reason).inc()
        running.ctx.log.error("lease.lost", reason=reason)
        if running.task is not None:
            running.task.cancel()

    # -- periodic maintenance -------------------------------------------------------------

    async def _maintenance_loop(self) -> None:
        interval = min(self.settings.reaper_interval_ms / 1000, 1.0)
        next_sample = next_prune = 0.0
        while True:
            try:
                for p in self.partitions:
                    await self.queue.promote_due(p)
                now = time.monotonic()
                if self.metrics is not None and now >= next_sample:
                    await self.metrics.sample_queues(self.queue, self.partitions)
                    next_sample = now + 5
                if now >= next_prune:
                    for p in self.partitions:
                        for s in STREAMS:
                            await self.queue.prune_consumers(p, s, CONSUMER_PRUNE_IDLE_MS)
                    next_prune = now + 600
            except REDIS_ERRORS as exc:
                self.log.warning("maintenance.redis_unavailable", error=str(exc))
            except Exception:
                self.log.exception("maintenance.failed")
            await asyncio.sleep(interval)
