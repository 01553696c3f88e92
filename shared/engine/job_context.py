"""What a job handler sees: the `JobHandler` contract (and `LifecycleHandler`, one with
resources to open and close), how a handler is named in settings (`load_handler_factory`), and
`JobContext`, the run a handler is given -- its job, its lease, progress, announcements,
metering, notes and the threads it may start."""

from __future__ import annotations

import asyncio
import importlib
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import orjson
import structlog
from redis.exceptions import ResponseError

from splatq.shared.engine import events
from splatq.shared.engine.events import EventType
from splatq.shared.engine.fleet import REDIS_ERRORS
from splatq.shared.engine.jobs import JobOutcome, JobRecord, StageDone
from splatq.shared.engine.keys import StreamName
from splatq.shared.engine.queue import JobQueue, StreamEntry
from splatq.shared.engine.replies import Reply, run_reply
from splatq.shared.errors import TIMEOUT, JobCanceled, LeaseLost, TransientError
from splatq.shared.redis.client import is_transient_reply
from splatq.shared.settings import Settings

log = structlog.get_logger("splatq.worker")
T = TypeVar("T")
PROGRESS_EVENT_INTERVAL_S = 1.0


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
        return self._fenced(outcome) is Reply.OK

    async def meter(self, unit: str, ms: int | None) -> bool:
        """Record a unit of work this run finished, with its measured time (meter.lua: fenced
        by the lease, once per unit; shared/engine/metering.py). Call it as soon as the work's
        outputs are stored -- before the next stop check, so a cancel that arrived meanwhile
        still finds the work metered. True when recorded now, False when the unit was
        metered already; raises `LeaseLost` when the run lost its job."""
        outcome = await self.queue.meter(self.job.id, self.token, unit, ms or 0)
        return self._fenced(outcome) is Reply.OK

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
        outcome = self._fenced(await self.queue.note(self.job.id, self.token, notes, event, extra))
        if outcome is Reply.CANCEL_REQUESTED:
            self.cancel_requested = True
        elif outcome is not Reply.OK:
            raise ValueError(f"note refused: {outcome}")

    def _fenced(self, outcome: str) -> Reply:
        """A fenced write's reply (replies.run_reply); a lost lease is remembered too."""
        try:
            return run_reply(self.job.id, outcome)
        except LeaseLost:
            self.lease_lost = True
            raise

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


async def run_within(
    handler: JobHandler, ctx: JobContext, timeout_s: float, stage: str = "job"
) -> JobOutcome | StageDone:
    """The handler's run, bounded by its stage's timeout (0: none): past it, a retryable
    `TIMEOUT`. A timeout raised inside the handler (a storage call's, say) is its own."""
    if not timeout_s:
        return await handler(ctx)
    scope = asyncio.timeout(timeout_s)
    try:
        async with scope:
            return await handler(ctx)
    except TimeoutError:
        if not scope.expired():
            raise
        raise TransientError(
            f"the {stage} stage ran past its {timeout_s} s timeout", code=TIMEOUT
        ) from None
