"""Process entry for a worker: logging, tracing, Redis, signals, the metrics and liveness
endpoint, then `Worker.run`.

Wiring only; the behaviour lives in `splatq.shared.engine.worker`.
"""

from __future__ import annotations

import asyncio
import signal

import structlog

from splatq.shared import tracing
from splatq.shared.engine.jobs import JobOutcome
from splatq.shared.engine.replicated_queue import open_queue
from splatq.shared.engine.worker import HandlerFactory, JobContext, JobHandler, Worker
from splatq.shared.liveness import health_endpoint
from splatq.shared.logs import configure_logging
from splatq.shared.metrics import EngineMetrics, register_build_info
from splatq.shared.redis.client import connect
from splatq.shared.settings import Settings

log = structlog.get_logger("splatq.runner")


async def run_worker(settings: Settings, factory: HandlerFactory, service: str = "worker") -> None:
    """Run one worker process until SIGTERM/SIGINT, then drain and exit."""
    configure_logging(settings.log_level, settings.log_format, service)
    tracing.configure_tracing(settings.tracing, service)
    handler = factory(settings)
    startup = getattr(handler, "startup", None)
    shutdown = getattr(handler, "shutdown", None)
    metrics = EngineMetrics.create(
        top_tenants=settings.metrics_top_tenants, named_tenants=settings.metrics_tenants
    )
    register_build_info(service=service)
    redis = connect(settings.redis_url, client_name=f"splatq-{service}")
    queue = open_queue(redis, settings)  # JobQueue, or WAIT after commits (replicated_queue)
    worker = Worker(queue, settings, traced(handler), metrics)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, worker.stop)
    try:
        async with health_endpoint(settings.metrics_port, settings.liveness_max_age_s):
            if startup is not None:
                await startup()
            await worker.run()
    finally:
        if shutdown is not None:
            await shutdown()
        await redis.aclose()
        tracing.shutdown_tracing()


def traced(handler: JobHandler) -> JobHandler:
    """`handler` inside a span per job run when tracing is on; `handler` itself when off."""
    if not tracing.enabled():
        return handler

    async def run(ctx: JobContext) -> JobOutcome:
        job = ctx.job
        attributes: dict[str, tracing.AttributeValue] = {
            "splatq.job_id": job.id,
            "splatq.tenant": job.tenant,
            "splatq.stream": ctx.stream.value,
            "splatq.attempt": ctx.attempt,
            "splatq.quality": job.quality,
        }
        with tracing.span("job.run", job.trace_id, kind="consumer", attributes=attributes):
            return await handler(ctx)

    return run
