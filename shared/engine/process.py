"""What every worker process does around its workers, whole-job or staged alike: logging,
the synthesis class's niceness, tracing and the allocator's policy before any handler starts
a thread (`prepare`), then the metrics, Redis, the job store, signals and the liveness
endpoint for as long as the workers run (`serving`). runner.py and stage_runner.py differ
only in which workers they start inside it."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Protocol

from splatq.shared import tracing
from splatq.shared.engine.memory import configure_worker_memory
from splatq.shared.engine.metrics import EngineMetrics, register_build_info
from splatq.shared.engine.queue import JobQueue
from splatq.shared.engine.replicated_queue import open_queue
from splatq.shared.engine.worker_classes import lower_if_synthesis_only
from splatq.shared.liveness import health_endpoint
from splatq.shared.logs import configure_logging
from splatq.shared.redis.client import connect
from splatq.shared.settings import Settings


def prepare(settings: Settings, service: str) -> None:
    """The process-wide setup that must come before the handlers are made (torch) or any
    pool starts threads."""
    configure_logging(settings.log_level, settings.log_format, service)
    # A synthesis-only process runs niced as a whole, every thread it will start too.
    lower_if_synthesis_only(
        settings.worker_classes, settings.synthesis_nice, settings.synthesis_idle
    )
    tracing.configure_tracing(settings.tracing, service)
    configure_worker_memory(
        settings.malloc_arena_max, settings.memory_trim, settings.memory_trim_interval_ms / 1000
    )


class Stoppable(Protocol):
    def stop(self) -> None: ...


class StopSwitch:
    """What SIGTERM/SIGINT calls: stops every worker added, before or after the signal (one
    that arrives while the process is still starting is not lost)."""

    def __init__(self) -> None:
        self.stopped = False
        self._targets: list[Stoppable] = []

    def add(self, target: Stoppable) -> None:
        self._targets.append(target)
        if self.stopped:
            target.stop()

    def __call__(self) -> None:
        self.stopped = True
        for target in self._targets:
            target.stop()


@dataclass(frozen=True, slots=True)
class Process:
    queue: JobQueue  # JobQueue, or one that WAITs after commits (replicated_queue)
    metrics: EngineMetrics


@asynccontextmanager
async def serving(
    settings: Settings, service: str, stop: Callable[[], None]
) -> AsyncIterator[Process]:
    """Metrics, Redis and the job store; `stop` on SIGTERM/SIGINT; the liveness endpoint
    while the body runs. Redis closes and traces flush on the way out."""
    metrics = EngineMetrics.create(
        top_tenants=settings.metrics_top_tenants, named_tenants=settings.metrics_tenants
    )
    register_build_info(service=service)
    redis = connect(settings.redis_url, client_name=f"splatq-{service}")
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    try:
        async with health_endpoint(settings.metrics_port, settings.liveness_max_age_s):
            yield Process(open_queue(redis, settings), metrics)
    finally:
        await redis.aclose()
        tracing.shutdown_tracing()
