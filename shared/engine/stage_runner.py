"""Process entry for a staged worker (`splatq worker --stages a,b,c`): one `Worker` per job
stage it runs -- each on its own stage's streams, with its own slots, attempts and timeout --
and the cleanup consumer when `cleanup` is among them, sharing one Redis connection pool, one
metrics registry, the stage handlers' resources (storage, model) and one fleet membership: the
process is one failure domain, so its stage workers take one consumer name, tick the fleet
clock once and count their jobs together (`FleetMember`, shared/engine/fleet.py).

Wiring only; the behaviour lives in `splatq.shared.engine.worker` and `.cleanup`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

import structlog

from splatq.shared.engine import process
from splatq.shared.engine.cleanup import CleanupWorker
from splatq.shared.engine.fleet import FleetMember
from splatq.shared.engine.job_context import JobHandler
from splatq.shared.engine.runner import traced
from splatq.shared.engine.stages import PIPELINE, PipelineStage
from splatq.shared.engine.worker import Worker
from splatq.shared.settings import Settings

log = structlog.get_logger("splatq.stage_runner")


class StageHandlerSet(Protocol):
    """What a staged worker runs: a handler per job stage, and the cleanup of a job."""

    def handler(self, stage: PipelineStage) -> JobHandler: ...

    async def startup(self, stages: tuple[PipelineStage, ...]) -> None: ...

    async def shutdown(self) -> None: ...

    async def cleanup(self, job_id: str) -> int: ...


StageHandlersFactory = Callable[[Settings], StageHandlerSet]
DEFAULT_STAGE_HANDLERS = "splatq.services.gpu_worker.stages:make"


async def run_stage_workers(
    settings: Settings,
    factory: StageHandlersFactory,
    stages: tuple[PipelineStage, ...],
    service: str = "worker",
) -> None:
    """Run the given stages in this process until SIGTERM/SIGINT, then drain and exit."""
    process.prepare(settings, service)
    handlers = factory(settings)
    switch = process.StopSwitch()
    async with process.serving(settings, service, switch) as proc:
        member = FleetMember()
        stoppable: list[Worker | CleanupWorker] = [
            Worker(
                proc.queue.for_stage(stage),
                settings.for_stage(stage.value),
                traced(handlers.handler(stage), stage.value),
                proc.metrics,
                sample_queues=i == 0,
                thread_setup=getattr(handlers, "thread_setup", None),
                member=member,
            )
            for i, stage in enumerate(s for s in stages if s in PIPELINE)
        ]
        if PipelineStage.CLEANUP in stages:
            stoppable.append(
                CleanupWorker(proc.queue, handlers.cleanup, proc.metrics, consumer=member.name)
            )
        for w in stoppable:
            switch.add(w)
        log.info("stage_worker.starting", stages=[s.value for s in stages], consumer=member.name)
        try:
            await handlers.startup(stages)
            await asyncio.gather(*(w.run() for w in stoppable))
        finally:
            await handlers.shutdown()
