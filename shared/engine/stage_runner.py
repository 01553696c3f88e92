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
import signal
from collections.abc import Callable
from typing import Protocol

import structlog

from splatq.shared import tracing
from splatq.shared.engine.cleanup import CleanupWorker
from splatq.shared.engine.fleet import FleetMember
from splatq.shared.engine.job_context import JobHandler
from splatq.shared.engine.memory import configure_worker_memory
from splatq.shared.engine.metrics import EngineMetrics, register_build_info
from splatq.shared.engine.replicated_queue import open_queue
from splatq.shared.engine.runner import traced
from splatq.shared.engine.stages import PIPELINE, PipelineStage
from splatq.shared.engine.worker import Worker
from splatq.shared.engine.worker_classes import lower_if_synthesis_only
from splatq.shared.liveness import health_endpoint
from splatq.shared.logs import configure_logging
from splatq.shared.redis.client import connect
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
    configure_logging(settings.log_level, settings.log_format, service)
    # A synthesis-only process runs niced as a whole, every thread it will start too.
    lower_if_synthesis_only(
        settings.worker_classes, settings.synthesis_nice, settings.synthesis_idle
    )
    tracing.configure_tracing(settings.tracing, service)
    # Before the handlers (torch) or any pool start threads: the allocator's policy.
    configure_worker_memory(
        settings.malloc_arena_max, settings.memory_trim, settings.memory_trim_interval_ms / 1000
    )
    handlers = factory(settings)
    metrics = EngineMetrics.create(
        top_tenants=settings.metrics_top_tenants, named_tenants=settings.metrics_tenants
    )
    register_build_info(service=service)
    redis = connect(settings.redis_url, client_name=f"splatq-{service}")
    queue = open_queue(redis, settings)
    member = FleetMember()
    workers = [
        Worker(
            queue.for_stage(stage),
            settings.for_stage(stage.value),
            traced(handlers.handler(stage), stage.value),
            metrics,
            sample_queues=i == 0,
            thread_setup=getattr(handlers, "thread_setup", None),
            member=member,
        )
        for i, stage in enumerate(s for s in stages if s in PIPELINE)
    ]
    cleaner = (
        CleanupWorker(queue, handlers.cleanup, metrics, consumer=member.name)
        if PipelineStage.CLEANUP in stages
        else None
    )
    stoppable: list[Worker | CleanupWorker] = [*workers, *([cleaner] if cleaner else [])]

    def stop() -> None:
        for w in stoppable:
            w.stop()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    log.info("stage_worker.starting", stages=[s.value for s in stages], consumer=member.name)
    try:
        async with health_endpoint(settings.metrics_port, settings.liveness_max_age_s):
            await handlers.startup(stages)
            await asyncio.gather(*(w.run() for w in stoppable))
    finally:
        await handlers.shutdown()
        await redis.aclose()
        tracing.shutdown_tracing()
