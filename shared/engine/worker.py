"""The worker runtime every job-running service builds on (the GPU worker first).

One process consumes both streams through the weighted slot pool (its fetch loop:
fetcher.py), heartbeats every lease in one pipelined call per tick, commits outcomes in
batches, reaps abandoned entries, promotes due retries and drains on SIGTERM. It knows
nothing of what a job computes: that is the handler's job.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time

import structlog
from redis.exceptions import ResponseError

from splatq.shared.engine import outcomes
from splatq.shared.engine.committer import Committer
from splatq.shared.engine.cpu_priority import ClassExecutors, ThreadSetup
from splatq.shared.engine.fetcher import ERROR_REPLY_BACKOFF_S, Fetcher
from splatq.shared.engine.fleet import REDIS_ERRORS, FleetMember, new_consumer_name
from splatq.shared.engine.job_context import JobContext, JobHandler, run_within
from splatq.shared.engine.jobs import JobOutcome, JobRecord, StageDone
from splatq.shared.engine.keys import STREAMS, StreamName
from splatq.shared.engine.leases import LeaseKeeper, Run
from splatq.shared.engine.metering import WHOLE_JOB_UNIT
from splatq.shared.engine.metrics import EngineMetrics
from splatq.shared.engine.queue import Finish, JobQueue, StreamEntry
from splatq.shared.engine.reaper import Reaper
from splatq.shared.engine.replies import Reply
from splatq.shared.engine.retries import decide_retry
from splatq.shared.engine.slots import SlotPool
from splatq.shared.engine.stages import next_stage
from splatq.shared.engine.unstarted import Unstarted
from splatq.shared.engine.upkeep import Upkeep
from splatq.shared.engine.worker_classes import parse_class_list
from splatq.shared.errors import (
    INVALID_OUTCOME,
    Deferred,
    ErrorInfo,
    JobCanceled,
    LeaseLost,
    PermanentError,
    classify,
)
from splatq.shared.redis.client import is_transient_reply
from splatq.shared.settings import Settings

log = structlog.get_logger("splatq.worker")


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
        self._running: dict[str, Run] = {}
        self._leases = LeaseKeeper(queue, settings, self.member, self._running, metrics)
        self.member.count(self._handlers_running)
        self.member.describe(self._card)
        self._stopping = asyncio.Event()
        self._releasing = False
        self.log = log.bind(consumer=self.consumer)
        self._committer = Committer(queue, self.log, metrics)
        self._fetcher = Fetcher(
            queue,
            self.pool,
            self.partitions,
            self.member,
            self.reaper,
            Unstarted(queue, self.reaper, metrics, self.log),
            self._launch,
            self._release_slot,
            self._stopping,
            self.log,
            settings.fetch_block_ms,
            metrics,
        )
        self._upkeep = Upkeep(
            queue,
            self.partitions,
            min(settings.reaper_interval_ms / 1000, 1.0),
            metrics,
            sample_queues,
            self.log,
        )
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
        stage = self.stage.value if self.stage is not None else None
        pool, running, partitions = self.pool, len(self._running), list(self.partitions)
        return {"stage": stage, "slots": pool.total, "in_use": pool.in_use, "running": running,
                "partitions": partitions}  # fmt: skip

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
                await self._fetcher.wait_or_stop(asyncio.sleep(ERROR_REPLY_BACKOFF_S))
                if self._stopping.is_set():
                    return
        helpers = [
            asyncio.create_task(self._leases.run(), name="heartbeat"),
            asyncio.create_task(self._committer.run(), name="committer"),
            asyncio.create_task(self._upkeep.run(), name="maintenance"),
        ]
        self.member.join(self.queue, self.partitions, self.settings.fleet_tick_interval_s)
        self.log.info(
            "worker.started",
            partitions=list(self.partitions),
            slots={s.value: n for s, n in self.pool.reserved.items()},
        )
        self._check_stage_buffer()
        try:
            await self._fetcher.run()
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

    def _check_stage_buffer(self) -> None:
        """A stage's backpressure bound counts its own running jobs: set below its slots, the
        stage can never fill them and polls while held (measured: half the throughput at 50
        slots against 32). Said once at start, so that an operator sees it."""
        bound = self.settings.stage_buffer
        has_next = self.stage is not None and next_stage(self.stage) is not None
        if has_next and 0 < bound < self.pool.total:
            self.log.warning(
                "stage.buffer_below_slots",
                stage=self.stage.value if self.stage is not None else "",
                slots=self.pool.total,
                stage_buffer=bound,
                hint="raise SPLATQ_STAGE_BUFFER above the stage's slots (docs/operations.md)",
            )

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
            await asyncio.wait_for(self._committer.join(), timeout_s)
        except TimeoutError:
            self.log.error("worker.commits_unflushed", queued=self._committer.queued())

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
        self._fetcher.slot_freed()
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
        running = Run(ctx)
        older = self._running.get(job.id)
        if older is not None:
            # The job was started again (its lease was taken over) while an older run of it
            # is still here: that run is fenced out -- its lease token is no longer the job's,
            # so it commits nothing -- and stopped. Only one run per job id is tracked.
            self._leases.lose(older, "superseded", force=True)
        self._running[job.id] = running
        running.task = asyncio.create_task(self._run_job(running), name=f"job:{job.id}")
        if self.metrics is not None:
            self.metrics.slots_in_use.labels(entry.stream.value).set(
                self.pool.running[entry.stream]
            )
            self.metrics.observe_started(job)

    async def _run_job(self, running: Run) -> None:  # noqa: PLR0912, PLR0915 - one outcome per exit path
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
                outcome = await run_within(
                    self.handler,
                    ctx,
                    self.stage_timeout_s,
                    self.stage.value if self.stage else "job",
                )
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
                    finish = outcomes.finish_of(ctx, "queued", handoff=True)
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
                result, status = await self._committer.commit(finish)
                if result == Reply.LEASE_LOST:
                    outcome_label = "lease_lost"
                elif result == Reply.OK and status == "canceled":
                    outcome_label = "canceled"
                elif result == Reply.OK and finish.dead_letter and self.metrics is not None:
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

    def _count_run(self, running: Run, outcome_label: str) -> None:
        if self.metrics is not None:
            elapsed = time.monotonic() - running.started_at
            self.metrics.observe_run(
                running.ctx.job, running.ctx.stream, self.stage, outcome_label, elapsed
            )

    async def _advance(
        self, ctx: JobContext, done: StageDone, running: Run
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
        request = outcomes.advance_of(ctx, done, stage, after, int(time.time() * 1000))
        running.committing = True
        result, detail = await self._committer.advance(request)
        if result == Reply.OK:
            ctx.log.info(
                "stage.advanced",
                stage=stage.value,
                next_stage=after.value,
                skipped=done.skipped,
                duration_ms=round((time.monotonic() - running.started_at) * 1000),
            )
            return None, "advanced"
        if result == Reply.CANCEL_REQUESTED:
            return outcomes.finish_of(ctx, "canceled"), "canceled"
        if result == Reply.LEASE_LOST:
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
        return outcomes.finish_of(ctx, "canceled")

    def _deferred(self, ctx: JobContext, exc: Deferred) -> Finish:
        ctx.log.info("job.deferred", reason=exc.reason, delay_ms=exc.delay_ms)
        return outcomes.deferred(ctx, exc)

    def _success(self, ctx: JobContext, outcome: JobOutcome) -> tuple[Finish, str]:
        elapsed_ms = round((time.monotonic() - ctx.started_at) * 1000)
        answer = outcomes.success(ctx, outcome, elapsed_ms, whole_job=self.stage is None)
        if isinstance(answer, ErrorInfo):
            return self._failure(ctx, answer, PermanentError(answer.message))
        return answer, "completed"

    def _failure(self, ctx: JobContext, info: ErrorInfo, exc: BaseException) -> tuple[Finish, str]:
        s = self.settings
        decision = decide_retry(
            info, ctx.attempt, s.max_attempts, s.retry_base_ms, s.retry_cap_ms, self._rng
        )
        if decision.retry:
            if self.metrics is not None:
                self.metrics.retries.labels(ctx.stream.value, info.code).inc()
            ctx.log.warning(
                "job.retry_scheduled",
                code=info.code,
                error=info.message,
                delay_ms=decision.delay_ms,
            )
        else:
            ctx.log.error(
                "job.failed",
                code=info.code,
                error=info.message,
                exc_info=exc if not info.retryable else None,
            )
        return outcomes.failure(ctx, info, decision, s.dead_letter_codes)
