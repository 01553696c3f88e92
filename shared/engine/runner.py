"""Process entry for a whole-job worker: the process around it (process.py), then
`Worker.run`.

Wiring only; the behaviour lives in `splatq.shared.engine.worker`.
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog

from splatq.shared import tracing
from splatq.shared.engine import process
from splatq.shared.engine.backlog import read_backlog
from splatq.shared.engine.job_context import HandlerFactory, JobContext, JobHandler
from splatq.shared.engine.jobs import JobOutcome, StageDone
from splatq.shared.engine.queue import JobQueue
from splatq.shared.engine.worker import Worker
from splatq.shared.settings import Settings

log = structlog.get_logger("splatq.runner")


# A burst worker stops after this many idle looks in a row (two: a job moving between the
# delayed set, its stream and the pending list between two reads is seen by the next look).
BURST_IDLE_LOOKS = 2


async def run_worker(
    settings: Settings, factory: HandlerFactory, service: str = "worker", burst: bool = False
) -> None:
    """Run one worker process until SIGTERM/SIGINT, then drain and exit. `burst`: also stop
    (and return) once nothing waits, is delayed or runs in the partitions it owns."""
    process.prepare(settings, service)
    handler = factory(settings)
    startup = getattr(handler, "startup", None)
    shutdown = getattr(handler, "shutdown", None)
    switch = process.StopSwitch()
    async with process.serving(settings, service, switch) as proc:
        worker = Worker(
            proc.queue,
            settings,
            traced(handler),
            proc.metrics,
            thread_setup=getattr(handler, "thread_setup", None),
        )
        switch.add(worker)
        watcher = asyncio.create_task(stop_when_drained(proc.queue, worker)) if burst else None
        try:
            if startup is not None:
                await startup()
            await worker.run()
        finally:
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
            if shutdown is not None:
                await shutdown()


def traced(handler: JobHandler, stage: str = "") -> JobHandler:
    """`handler` inside a span per job run (`job.run`, or `stage.<name>` for a pipeline
    stage's run) when tracing is on; `handler` itself when off."""
    if not tracing.enabled():
        return handler

    async def run(ctx: JobContext) -> JobOutcome | StageDone:
        job = ctx.job
        attributes: dict[str, tracing.AttributeValue] = {
            "splatq.job_id": job.id,
            "splatq.tenant": job.tenant,
            "splatq.stream": ctx.stream.value,
            "splatq.attempt": ctx.attempt,
            "splatq.quality": job.quality,
        }
        name = "job.run"
        if stage:
            attributes["splatq.stage"] = stage
            name = f"stage.{stage}"
        with tracing.span(name, job.trace_id, kind="consumer", attributes=attributes):
            return await handler(ctx)

    return run


async def stop_when_drained(queue: JobQueue, worker: Worker) -> None:
    """Burst mode: look at the owned partitions every fetch interval; stop the worker after
    BURST_IDLE_LOOKS idle looks in a row. A failed look (Redis away) counts as busy."""
    settings = queue.settings
    interval_s = min(1.0, max(0.05, settings.fetch_block_ms / 1000))
    idle_looks = 0
    while True:
        await asyncio.sleep(interval_s)
        try:
            backlogs = [
                await read_backlog(queue.redis, queue.keys, queue.group, p)
                for p in settings.owned_partitions
            ]
        except Exception as exc:
            log.warning("worker.burst_look_failed", error=str(exc)[:300])
            idle_looks = 0
            continue
        idle = worker.running_jobs == 0 and all(b.idle for b in backlogs)
        idle_looks = idle_looks + 1 if idle else 0
        if idle_looks >= BURST_IDLE_LOOKS:
            log.info("worker.burst_drained", partitions=list(settings.owned_partitions))
            worker.stop()
            return
