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
import random
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import orjson
import structlog
from redis.exceptions import ResponseError

from splatq.shared.engine import events
from splatq.shared.engine.cpu_priority import ClassExecutors, ThreadSetup
from splatq.shared.engine.entries import UNKNOWN_JOB, entry_problem
from splatq.shared.engine.events import EventType
from splatq.shared.engine.fleet import REDIS_ERRORS, FleetMember, new_consumer_name
from splatq.shared.engine.jobs import JobOutcome, JobRecord, StageDone
from splatq.shared.engine.keys import STREAMS, StreamName
from splatq.shared.engine.metering import METER_PREFIX, WHOLE_JOB_UNIT
from splatq.shared.engine.metrics import EngineMetrics
from splatq.shared.engine.queue import RENEW_UNKNOWN, Advance, Finish, JobQueue, StreamEntry
from splatq.shared.engine.reaper import Reaper
from splatq.shared.engine.retries import decide_retry
from splatq.shared.engine.slots import SlotPool
from splatq.shared.engine.stages import PIPELINE, StageRecord, StageStatus, next_stage
from splatq.shared.engine.worker_classes import parse_class_list
from splatq.shared.errors import (
    CORRUPT_JOB_RECORD,
    INVALID_OUTCOME,
    TIMEOUT,
    Deferred,
    ErrorInfo,
    JobCanceled,
    LeaseLost,
    PermanentError,
    TransientError,
    classify,
)
from splatq.shared.redis.client import error_reply_kind, is_transient_reply
from splatq.shared.settings import Settings

log = structlog.get_logger("splatq.worker")
T = TypeVar("T")

# How long a worker keeps resending one take/start call whose reply was lost (the replay
# memo answers the resend with the first execution's reply, so nothing runs twice).
RESEND_WINDOW_S = 5.0
# Back-off after an error reply the fetch loop cannot act on (a script error, OOM).
ERROR_REPLY_BACKOFF_S = 1.0
PROGRESS_EVENT_INTERVAL_S = 1.0
CONSUMER_PRUNE_IDLE_MS = 3_600_000
# How long the fetch loop waits before looking again when it cannot block (a saturated
# stream, or several partitions): bounds the start latency of newly arrived work.
IDLE_POLL_S = 0.05


class JobHandler(Protocol):
    """What the worker runs for each job. Raise `PermanentError`/`TransientError` (with a
    code) to fail or retry; call `ctx.progress()` at stage boundaries."""

    async def __call__(self, ctx: JobContext) -> JobOutcome | StageDone: ...


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
    started_at: float = field(default_factory=time.monotonic)
    _last_event_at: float = 0.0
    _last_stage: str = ""
    _last_fraction: float | None = None
    _threads: set[asyncio.Future[None]] = field(default_factory=set)
    # Where run_blocking runs (the class's pool: see cpu_priority); None = asyncio's default.
    executor: Executor | None = None

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
        or on a new stage. Raises `JobCanceled`/`LeaseLost` when the job must stop; while
        Redis cannot be reached the report is skipped and the job goes on."""
        self.raise_if_stopped()
        now = time.monotonic()
        emit = stage != self._last_stage or now - self._last_event_at >= PROGRESS_EVENT_INTERVAL_S
        try:
            reply = await self.queue.report_progress(
                self.job.id, self.token, min(max(fraction, 0.0), 1.0), stage, emit
            )
        except (*REDIS_ERRORS, ResponseError) as exc:
            if isinstance(exc, ResponseError) and not is_transient_reply(exc):
                raise
            # Progress is a report, not the fence: Redis being unreachable is not the job's
            # fault, so the job goes on (the heartbeat and the commit still decide).
            self.log.warning("progress.not_recorded", stage=stage, error=str(exc)[:200])
            return
        self._last_fraction = fraction
        if emit:
            self._last_event_at, self._last_stage = now, stage
        if reply == 0:
            self.lease_lost = True
        elif reply == 2:
            self.cancel_requested = True
        self.raise_if_stopped()

    async def announce(
        self, event: str, extra: str = "", fields: Mapping[str, str] | None = None
    ) -> bool:
        """Send a one-off event of this job now, from inside the run (fenced by the lease,
        once per job: see announce.lua), writing `fields` with it. True when it went out
        now, False when it had already; raises `LeaseLost` when the run lost its job."""
        outcome = await self.queue.announce(self.job.id, self.token, event, extra, fields)
        if outcome == "lease_lost":
            self.lease_lost = True
            raise LeaseLost(self.job.id)
        return outcome == "ok"

    async def meter(self, unit: str, ms: int | None) -> bool:
        """Record a unit of work this run finished, with its measured time (meter.lua: fenced
        by the lease, once per unit; shared/engine/metering.py). Call it as soon as the work's
        outputs are stored -- before the next stop check, so a cancel that arrived meanwhile
        still finds the work metered. True when recorded now, False when the unit was
        metered already; raises `LeaseLost` when the run lost its job."""
        outcome = await self.queue.meter(self.job.id, self.token, unit, ms or 0)
        if outcome == "lease_lost":
            self.lease_lost = True
            raise LeaseLost(self.job.id)
        return outcome == "ok"

    async def note(
        self, notes: Mapping[str, str], event_extra: Mapping[str, object] | None = None
    ) -> None:
        """Write notes of this run into the job (`note.<name>`, note.lua: fenced by the
        lease), visible to a run that takes the job over (`job.notes`) and to users; with
        `event_extra`, a `progress` event carrying those members goes out in the same step.
        Raises `LeaseLost` when the run lost its job; notes a cancel it reports."""
        extra = ""
        if event_extra is not None:
            fraction = self.job.progress if self._last_fraction is None else self._last_fraction
            extra = events.progress_fields(fraction, self._last_stage or self.job.stage)
            extra += "," + orjson.dumps(dict(event_extra)).decode()[1:-1]
        event = EventType.PROGRESS.value if event_extra is not None else ""
        outcome = await self.queue.note(self.job.id, self.token, notes, event, extra)
        if outcome == "lease_lost":
            self.lease_lost = True
            raise LeaseLost(self.job.id)
        if outcome == "cancel_requested":
            self.cancel_requested = True
        elif outcome != "ok":
            raise ValueError(f"note refused: {outcome}")

    async def run_blocking(self, fn: Callable[..., T], *args: Any) -> T:
        """Run CPU/GPU-bound work in a thread so the event loop keeps renewing leases.

        A thread cannot be stopped: when the job is canceled or loses its lease the call
        raises at once, but the worker keeps the job's slot until the thread has returned
        (see `threads_done`), so a lost job never runs alongside the slot's next one."""
        loop = asyncio.get_running_loop()
        finished: asyncio.Future[None] = loop.create_future()
        self._threads.add(finished)
        finished.add_done_callback(self._threads.discard)

        def call() -> T:
            try:
                return fn(*args)
            finally:
                loop.call_soon_threadsafe(_resolve, finished)

        if self.executor is None:
            return await asyncio.to_thread(call)
        return await loop.run_in_executor(self.executor, call)

    @property
    def has_threads(self) -> bool:
        return bool(self._threads)

    async def threads_done(self) -> None:
        """Wait for every thread this job started (their results are no longer wanted)."""
        while self._threads:
            await asyncio.wait(list(self._threads))


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


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
        sample_queues: bool = True,
        thread_setup: ThreadSetup | None = None,
        member: FleetMember | None = None,
    ) -> None:
        self.queue = queue
        self.settings = settings
        self.handler = handler
        self.metrics = metrics
        # The process this worker is part of (shared/engine/fleet.py): its name is this
        # worker's consumer name, and the fleet counts the process, not its stage workers.
        if member is not None and consumer is not None and consumer != member.name:
            raise ValueError(f"consumer {consumer!r} is not the member's name {member.name!r}")
        self.member = member or FleetMember(consumer or new_consumer_name())
        self.consumer = self.member.name
        # One worker per process samples the queue gauges (a staged process runs several).
        self.sample_queues = sample_queues
        # The pipeline stage this worker runs (its queue reads that stage's streams); None:
        # whole jobs. A stage's slots and attempts come from settings.for_stage.
        self.stage = queue.stage
        self.stage_timeout_s = (
            settings.stage_timeout_s.get(self.stage.value, 0) if self.stage is not None else 0
        )
        # The classes this process serves (worker_classes.py): both share the slot pool, or
        # one owns it (a per-class process).
        self.pool = SlotPool.create(
            settings.worker_concurrency,
            settings.interactive_share,
            parse_class_list(settings.worker_classes),
        )
        # run_blocking's threads, per class; `thread_setup` is the handler's per-thread setup
        # (defaults to its `thread_setup` attribute, if it has one).
        self.executors = ClassExecutors(
            settings.synthesis_nice,
            max(settings.worker_concurrency, 1),
            "splatq-job",
            thread_setup or getattr(handler, "thread_setup", None),
        )
        self.partitions = settings.owned_partitions
        self.reaper = Reaper(
            queue,
            self.consumer,
            settings.reaper_interval_ms / 1000,
            metrics,
            running_here=self._runs_here,
        )
        self._rng = rng or random.Random()
        self._running: dict[str, _Running] = {}
        self.member.count(self._handlers_running)
        self.member.describe(self._card)
        self._commits: asyncio.Queue[_Commit] = asyncio.Queue()
        self._slot_freed = asyncio.Event()
        self._stopping = asyncio.Event()
        self._releasing = False
        self._rotation = 0
        # The last take was cut short by the next stage's backpressure bound.
        self._held = False
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

    def _handlers_running(self) -> int:
        """This worker's share of its process's `co_running` (see FleetMember.running): runs
        whose handler has not returned -- a run past it is committing, and its job may already
        be starting in the next stage here, which must not count it twice."""
        return sum(not r.committing for r in self._running.values())

    def _card(self) -> dict[str, object]:
        """This worker on its process's card (the admin API's worker view)."""
        return {
            "stage": self.stage.value if self.stage is not None else None,
            "slots": self.pool.total,
            "in_use": self.pool.in_use,
            "running": len(self._running),
            "partitions": list(self.partitions),
        }

    async def run(self) -> None:
        """Run until `stop()`; then drain within the grace period and return."""
        while True:
            # Starting while Redis is down or refusing writes (OOM, READONLY) waits it out.
            try:
                await self.queue.setup()
                break
            except (*REDIS_ERRORS, ResponseError) as exc:
                if isinstance(exc, ResponseError) and not is_transient_reply(exc):
                    raise
                self.log.warning("worker.setup_waiting_for_redis", error=str(exc)[:300])
                await self._wait_or_stop(asyncio.sleep(ERROR_REPLY_BACKOFF_S))
                if self._stopping.is_set():
                    return
        helpers = [
            asyncio.create_task(self._heartbeat_loop(), name="heartbeat"),
            asyncio.create_task(self._commit_loop(), name="committer"),
            asyncio.create_task(self._maintenance_loop(), name="maintenance"),
        ]
        self.member.join(self.queue, self.partitions, self.settings.fleet_tick_interval_s)
        self.log.info(
            "worker.started",
            partitions=list(self.partitions),
            slots={s.value: n for s, n in self.pool.reserved.items()},
        )
        try:
            await self._fetch_loop()
            await self._drain()
            await self._flush_commits(self.settings.shutdown_grace_s)
        finally:
            for task in helpers:
                task.cancel()
            for task in helpers:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await self.member.leave()
            self.executors.shutdown()
            self.log.info("worker.stopped")

    async def _drain(self) -> None:
        tasks = [r.task for r in self._running.values() if r.task is not None]
        if tasks:
            self.log.info(
                "worker.draining", running=len(tasks), grace_s=self.settings.shutdown_grace_s
            )
            _, pending = await asyncio.wait(tasks, timeout=self.settings.shutdown_grace_s)
            if pending:
                # Past the grace period: release what is left without burning attempts. A
                # job already handing its outcome to the committer is not interrupted: its
                # result is done and only needs writing.
                self._releasing = True
                for r in list(self._running.values()):
                    if r.task is not None and r.task in pending and not r.committing:
                        r.task.cancel()
                await asyncio.wait(pending, timeout=self.settings.shutdown_grace_s)

    async def _flush_commits(self, timeout_s: float) -> None:
        """Wait until every queued commit has been sent and answered (bounded), so stopping
        the committer drops nothing a job already handed over."""
        try:
            await asyncio.wait_for(self._commits.join(), timeout_s)
        except TimeoutError:
            self.log.error("worker.commits_unflushed", queued=self._commits.qsize())

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
            except ResponseError as exc:
                # OOM, READONLY, a script error: the worker keeps its running jobs and tries
                # again, instead of dying with their results.
                self.log.error(
                    "fetch.error_reply", error=str(exc)[:300], transient=is_transient_reply(exc)
                )
                if self.metrics is not None:
                    self.metrics.error_replies.labels("fetch", error_reply_kind(exc)).inc()
                await self._wait_or_stop(asyncio.sleep(ERROR_REPLY_BACKOFF_S))

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
            for stream in self.pool.serves:
                capacity = self.pool.capacity(stream)
                if capacity and self.reaper.is_due(partition, stream):
                    taken = await self.reaper.reap_stale_entries(partition, stream, capacity)
                    consumed += len(taken)
                    await self._start(taken)
            consumed += await self._take(partition)
        if consumed or self._stopping.is_set():
            return consumed
        if self._held:
            # The next stage is full: a blocking read would take past its bound, so look
            # again shortly (or when a slot frees) instead.
            self._held = False
            self._slot_freed.clear()
            await self._wait_or_stop(self._slot_freed.wait(), timeout_s=IDLE_POLL_S)
            return 0
        if not self.pool.waits_on_all():
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
            await self.queue.wait_for_new(partition, self.pool.serves, self.consumer, block_ms)
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
            partition,
            self.pool.guaranteed_counts(),
            self.pool.lendable,
            self.consumer,
            resend_for_s=RESEND_WINDOW_S,
            running=self.member.running(),
        )
        held = 0
        for t in taken:
            if t.outcome == "held":
                self._held = True
                held += 1
                continue
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
            elif t.outcome == "dead_lettered":
                self._count_corrupt(t.entry, t.detail)
            else:
                self.log.info("entry.not_started", entry_id=t.entry.entry_id, outcome=t.outcome)
        return len(taken) - held

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
            results = await self.queue.start_many(
                valid,
                tokens,
                self.consumer,
                resend_for_s=RESEND_WINDOW_S,
                running=self.member.running() + len(valid),
            )
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
            elif result.outcome == "dead_lettered":
                self._count_corrupt(entry, result.detail)
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

    def _count_corrupt(self, entry: StreamEntry, detail: str) -> None:
        """take/start found a corrupt job record and dead-lettered it in the same script."""
        if self.metrics is not None:
            self.metrics.dead_letters.labels(entry.stream.value, "corrupt_job_record").inc()
        self.log.error(
            "job.corrupt_record_dead_lettered",
            entry_id=entry.entry_id,
            stream=entry.stream.value,
            detail=detail,
        )

    def _runs_here(self, entry: StreamEntry) -> bool:
        """True when this worker runs this very entry's job under a lease it still holds:
        the reaper must leave it to the heartbeat (which re-takes a lapsed lease nobody else
        took) instead of starting a second run of the same job in the same process."""
        running = self._running.get(entry.fields.get("job", ""))
        return (
            running is not None
            and running.ctx.entry.entry_id == entry.entry_id
            and not running.ctx.lease_lost
        )

    def _release_slot(self, stream: StreamName) -> None:
        self.pool.release(stream)
        self._slot_freed.set()
        if self.metrics is not None:
            self.metrics.slots_in_use.labels(stream.value).set(self.pool.running[stream])

    # -- running one job ----------------------------------------------------------------

    def _launch(self, entry: StreamEntry, token: str, job: JobRecord) -> None:
        bound = self.log.bind(
            job_id=job.id,
            trace_id=job.trace_id,
            stream=entry.stream.value,
            attempt=job.attempts,
            tenant=job.tenant,
        )
        ctx = JobContext(
            job=job,
            entry=entry,
            token=token,
            queue=self.queue,
            log=bound,
            executor=self.executors.for_stream(entry.stream),
        )
        running = _Running(ctx)
        older = self._running.get(job.id)
        if older is not None:
            # The job was started again (its lease was taken over) while an older run of it
            # is still here: that run is fenced out -- its lease token is no longer the job's,
            # so it commits nothing -- and stopped. Only one run per job id is tracked.
            self._lose_lease(older, "superseded", force=True)
        self._running[job.id] = running
        running.task = asyncio.create_task(self._run_job(running), name=f"job:{job.id}")
        if self.metrics is not None:
            self.metrics.slots_in_use.labels(entry.stream.value).set(
                self.pool.running[entry.stream]
            )
            self.metrics.observe_started(job)

    async def _run_job(self, running: _Running) -> None:  # noqa: PLR0912, PLR0915 - one outcome per exit path
        ctx = running.ctx
        structlog.contextvars.bind_contextvars(
            job_id=ctx.job.id,
            trace_id=ctx.job.trace_id,
            stream=ctx.stream.value,
            attempt=ctx.attempt,
            tenant=ctx.job.tenant,
        )
        ctx.log.debug("job.started")
        finish: Finish | None = None
        outcome_label = "lease_lost"
        try:
            try:
                outcome = await self._call_handler(ctx)
            except JobCanceled:
                finish, outcome_label = await self._canceled(ctx), "canceled"
            except LeaseLost:
                finish = None
            except Deferred as exc:
                finish, outcome_label = self._deferred(ctx, exc), "deferred"
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
                if isinstance(outcome, StageDone):
                    finish, outcome_label = await self._advance(ctx, outcome, running)
                else:
                    finish, outcome_label = self._success(ctx, outcome)
            if ctx.lease_lost:
                finish, outcome_label = None, "lease_lost"
            if finish is not None:
                running.committing = True
                result, status = await self._commit(finish)
                if result == "lease_lost":
                    outcome_label = "lease_lost"
                elif result == "ok" and status == "canceled":
                    outcome_label = "canceled"
                elif result == "ok" and finish.dead_letter and self.metrics is not None:
                    self.metrics.dead_letters.labels(ctx.stream.value, finish.dead_letter).inc()
                ctx.log.info(
                    "job.finished",
                    outcome=outcome_label,
                    commit=result,
                    status=status,
                    duration_ms=round((time.monotonic() - running.started_at) * 1000),
                )
            elif outcome_label == "lease_lost":
                ctx.log.warning("job.abandoned", reason="lease_lost")
        finally:
            # A run removes only its own entry: a newer run of the same job may be there.
            if self._running.get(ctx.job.id) is running:
                del self._running[ctx.job.id]
            # The slot is free only when no thread of this job is still computing.
            if ctx.has_threads:
                await asyncio.shield(ctx.threads_done())
            self._release_slot(ctx.stream)
            self._count_run(running, outcome_label)

    def _count_run(self, running: _Running, outcome_label: str) -> None:
        if self.metrics is None:
            return
        ctx, elapsed = running.ctx, time.monotonic() - running.started_at
        self.metrics.jobs.labels(ctx.stream.value, outcome_label).inc()
        self.metrics.job_duration.labels(ctx.stream.value, outcome_label).observe(elapsed)
        self.metrics.observe_finished(ctx.job, outcome_label, elapsed)
        if self.stage is not None:
            labels = (self.stage.value, ctx.stream.value, outcome_label)
            self.metrics.stage_runs.labels(*labels).inc()
            self.metrics.stage_duration.labels(*labels).observe(elapsed)

    async def _call_handler(self, ctx: JobContext) -> JobOutcome | StageDone:
        """The handler's run, bounded by its stage's timeout (a retryable TIMEOUT)."""
        if not self.stage_timeout_s:
            return await self.handler(ctx)
        scope = asyncio.timeout(self.stage_timeout_s)
        try:
            async with scope:
                return await self.handler(ctx)
        except TimeoutError:
            if not scope.expired():
                raise  # the handler's own timeout (a storage call's, say), not the stage's
            stage = self.stage.value if self.stage is not None else "job"
            raise TransientError(
                f"the {stage} stage ran past its {self.stage_timeout_s} s timeout",
                code=TIMEOUT,
            ) from None

    async def _advance(
        self, ctx: JobContext, done: StageDone, running: _Running
    ) -> tuple[Finish | None, str]:
        """Commit a stage's success: its ledger record, and the job queued on the next stage
        (advance.lua), resent until the answer is definite like a finish. Returns a finish
        still to commit (a cancel that arrived meanwhile) and the outcome label."""
        stage = self.stage
        after = next_stage(stage) if stage is not None else None
        if stage is None or after is None:
            exc = PermanentError(
                f"a StageDone from the {stage or 'whole-job'} handler, which has no next stage"
            )
            return self._failure(ctx, ErrorInfo(INVALID_OUTCOME, exc.message, False), exc)
        now_ms = int(time.time() * 1000)
        record = StageRecord(
            status=StageStatus.SUCCEEDED,
            attempts=ctx.attempt,
            started_at_ms=ctx.job.started_at_ms,
            finished_at_ms=now_ms,
            digest=done.digest,
            outputs=done.outputs,
            skipped=done.skipped,
            work_ms=done.work_ms,
            facts=done.facts,
        )
        position = PIPELINE.index(stage) + 1
        request = Advance(
            job_id=ctx.job.id,
            stream=ctx.stream,
            entry_id=ctx.entry.entry_id,
            token=ctx.token,
            stage=stage.value,
            next_stage=after.value,
            record=record.to_json(),
            progress=round(position / len(PIPELINE), 4),
            event_extra=events.stage_fields(
                position / len(PIPELINE), stage.value, StageStatus.SUCCEEDED.value, after.value
            ),
            also_event=done.also_event,
            also_extra=done.also_extra,
        )
        running.committing = True
        delay = 0.05
        while True:
            try:
                result, detail = await self.queue.advance(request)
            except REDIS_ERRORS as exc:
                result, detail = "retry", str(exc)
            if result not in ("retry", "transient"):
                break
            self.log.warning("advance.resend", error=detail[:300])
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)
        if result == "ok":
            ctx.log.info(
                "stage.advanced",
                stage=stage.value,
                next_stage=after.value,
                skipped=done.skipped,
                duration_ms=round((time.monotonic() - running.started_at) * 1000),
            )
            return None, "advanced"
        if result == "cancel_requested":
            return self._finish(ctx, "canceled"), "canceled"
        if result == "lease_lost":
            ctx.lease_lost = True
            return None, "lease_lost"
        ctx.log.error("stage.advance_refused", stage=stage.value, result=result, detail=detail)
        return None, "error"

    async def _canceled(self, ctx: JobContext) -> Finish:
        """The cancel commit. A whole job canceled mid-run is metered for the time it ran (a
        staged job's units were metered as each stage finished them); best effort: a run that
        cannot reach Redis still commits its cancel."""
        if self.stage is None:
            ms = round((time.monotonic() - ctx.started_at) * 1000)
            with contextlib.suppress(LeaseLost, *REDIS_ERRORS, ResponseError):
                await ctx.meter(WHOLE_JOB_UNIT, ms)
        return self._finish(ctx, "canceled")

    def _deferred(self, ctx: JobContext, exc: Deferred) -> Finish:
        """A handler's "not now" (errors.Deferred): the job is parked on the delayed set for
        the delay, and the attempt and the delivery this run used are written back in the
        same fenced commit (a run that lost its job commits nothing, so the counts it read at
        its start are still the job's)."""
        ctx.log.info("job.deferred", reason=exc.reason, delay_ms=exc.delay_ms)
        fields = {
            "attempts": str(max(ctx.job.attempts - 1, 0)),
            "deliveries": str(max(ctx.job.deliveries - 1, 0)),
            "deferrals": str(ctx.job.deferrals + 1),
            "deferred_reason": exc.reason[:200],
        }
        return self._finish(ctx, "retrying", retry_delay_ms=exc.delay_ms, fields=fields)

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

    def _success(self, ctx: JobContext, outcome: JobOutcome) -> tuple[Finish, str]:
        problem = outcome.problem() if isinstance(outcome, JobOutcome) else "not a JobOutcome"
        if problem is not None:
            exc = PermanentError(f"the handler's outcome cannot be stored: {problem}")
            return self._failure(ctx, ErrorInfo(INVALID_OUTCOME, exc.message, False), exc)
        model = outcome.model or ctx.job.model
        compute_ms = outcome.compute_time_ms
        if compute_ms is None:
            compute_ms = round((time.monotonic() - ctx.started_at) * 1000)
        fields: dict[str, str] = {
            "artifacts": orjson.dumps(dict(outcome.artifacts)).decode(),
            "compute_time_ms": str(compute_ms),
            "model": model,
            **outcome.extra_fields,
        }
        if self.stage is None:
            # A whole job is one unit of work, metered with its completion (a staged job's
            # stages meter their own units as they finish them).
            fields[METER_PREFIX + WHOLE_JOB_UNIT] = str(compute_ms)
        return self._finish(
            ctx,
            "completed",
            event=EventType.COMPLETED.value,
            event_extra=events.completed_fields(model, compute_ms, outcome.artifacts),
            claim_status="COMPLETED",
            fields=fields,
        ), "completed"

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
            dead_letter=info.code if info.code in s.dead_letter_codes else "",
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
            try:
                await self._commit_batch(batch)
            finally:
                for _ in batch:
                    self._commits.task_done()

    async def _commit_batch(self, batch: list[_Commit]) -> None:
        """Send a batch until each call has a definite answer. A lost reply or a transient
        error reply (OOM, READONLY) is resent with the same request id, which finish.lua
        recognises in the job's `last_commit` and answers as the first execution did; the
        run's lease token stays valid meanwhile (the heartbeat re-takes a lapsed lease nobody
        else took)."""
        todo = list(batch)
        delay = 0.05
        while todo:
            try:
                results = await self.queue.finish_many([c.finish for c in todo])
            except REDIS_ERRORS as exc:
                self.log.warning("commit.redis_unavailable", error=str(exc), jobs=len(todo))
                results = [("retry", str(exc))] * len(todo)
            except Exception as exc:
                self.log.exception("commit.failed", jobs=len(todo))
                results = [("error", str(exc))] * len(todo)
            retry: list[_Commit] = []
            for c, (outcome, detail) in zip(todo, results, strict=True):
                if outcome == "retry":
                    retry.append(c)
                elif outcome == "transient":
                    # OOM, READONLY...: the script did not run; the same call is sent again.
                    retry.append(c)
                    self.log.warning("commit.error_reply", error=detail[:300])
                    if self.metrics is not None:
                        self.metrics.error_replies.labels("commit", "transient").inc()
                elif not c.done.done():
                    c.done.set_result((outcome, detail))
            todo = retry
            if todo:
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    # -- heartbeats -----------------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        interval = self.settings.heartbeat_interval_s
        ttl_s = self.settings.lease_ttl_ms / 1000
        # After a failed renewal the next one comes sooner: the first renewal once Redis is
        # back is what keeps the jobs (reclaim.lua grants a lease TTL after an outage ends).
        pause = interval
        while True:
            await asyncio.sleep(pause)
            pause = interval
            running = list(self._running.values())
            if not running:
                continue
            leases = [
                (r.ctx.job.id, r.ctx.stream, r.ctx.entry.entry_id, r.ctx.token) for r in running
            ]
            try:
                replies = await self.queue.renew_many(
                    leases, self.consumer, running=self.member.running()
                )
            except Exception as exc:
                # Unknown, not lost: while Redis cannot answer, the jobs keep running. When it
                # answers again, renew re-takes each lapsed lease nobody else took, and says
                # 'lost' for the ones another worker took over (those then stop).
                if self.metrics is not None:
                    self.metrics.lease_renewal_failures.labels(type(exc).__name__).inc(len(running))
                now = time.monotonic()
                self.log.warning(
                    "lease.renew_failed",
                    error=str(exc)[:300],
                    jobs=len(running),
                    unconfirmed=sum(now - r.renewed_at > ttl_s for r in running),
                )
                pause = min(interval, 0.1)
                continue
            now = time.monotonic()
            for r, reply in zip(running, replies, strict=True):
                if reply == RENEW_UNKNOWN:
                    if self.metrics is not None:
                        self.metrics.lease_renewal_failures.labels("error_reply").inc()
                    continue
                if reply == 0:
                    self._lose_lease(r, "not_holder")
                else:
                    r.renewed_at = now
                    if reply == 2 and not r.ctx.cancel_requested:
                        r.ctx.cancel_requested = True
                        r.ctx.log.info("job.cancel_observed")

    def _lose_lease(self, running: _Running, reason: str, *, force: bool = False) -> None:
        """Stop a run that no longer holds its job. A committing run is left to its commit's
        own fence unless `force` (a newer run of the job replaces it here)."""
        if running.ctx.lease_lost or (running.committing and not force):
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
                if self.metrics is not None and self.sample_queues and now >= next_sample:
                    await self.metrics.sample_queues(
                        self.queue, self.partitions, staged=self.stage is not None
                    )
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
