"""Process entry for a worker: logging, Redis, signals, metrics endpoint, then `Worker.run`.

Wiring only; the behaviour lives in `splatq.shared.engine.worker`.
"""

from __future__ import annotations

import asyncio
import signal

import structlog
from prometheus_client import start_http_server

from splatq.shared.engine.replicated_queue import open_queue
from splatq.shared.engine.worker import HandlerFactory, Worker
from splatq.shared.logs import configure_logging
from splatq.shared.metrics import EngineMetrics
from splatq.shared.redis.client import connect
from splatq.shared.settings import Settings

log = structlog.get_logger("splatq.runner")


async def run_worker(settings: Settings, factory: HandlerFactory, service: str = "worker") -> None:
    """Run one worker process until SIGTERM/SIGINT, then drain and exit."""
    configure_logging(settings.log_level, settings.log_format, service)
    handler = factory(settings)
    startup = getattr(handler, "startup", None)
    shutdown = getattr(handler, "shutdown", None)
    metrics = EngineMetrics.create()
    if settings.metrics_port:
        start_http_server(settings.metrics_port)
    redis = connect(settings.redis_url, client_name=f"splatq-{service}")
    queue = open_queue(redis, settings)  # JobQueue, or WAIT after commits (replicated_queue)
    worker = Worker(queue, settings, handler, metrics)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, worker.stop)
    try:
        if startup is not None:
            await startup()
        await worker.run()
    finally:
        if shutdown is not None:
            await shutdown()
        await redis.aclose()
