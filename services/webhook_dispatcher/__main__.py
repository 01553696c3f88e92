"""`python -m splatq.services.webhook_dispatcher`: the dispatcher (as `splatq dispatcher`)."""

from __future__ import annotations

import asyncio
import signal

from splatq.services.webhook_dispatcher.dispatcher import Dispatcher
from splatq.services.webhook_dispatcher.metrics import DispatcherMetrics
from splatq.shared import tracing
from splatq.shared.engine.metrics import register_build_info
from splatq.shared.engine.queue import JobQueue
from splatq.shared.liveness import health_endpoint
from splatq.shared.logs import configure_logging
from splatq.shared.redis.client import connect
from splatq.shared.settings import Settings


async def run(settings: Settings) -> None:
    configure_logging(settings.log_level, settings.log_format, "dispatcher")
    tracing.configure_tracing(settings.tracing, "dispatcher")
    register_build_info(service="dispatcher")
    redis = connect(settings.redis_url, client_name="splatq-dispatcher")
    dispatcher = Dispatcher(JobQueue(redis, settings), metrics=DispatcherMetrics.create())
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, dispatcher.stop)
    try:
        async with health_endpoint(settings.metrics_port, settings.liveness_max_age_s):
            await dispatcher.run()
    finally:
        await redis.aclose()
        tracing.shutdown_tracing()


def main() -> None:
    asyncio.run(run(Settings.from_env()))


if __name__ == "__main__":
    main()
