"""`python -m splatq.services.webhook_dispatcher`: the dispatcher (as `splatq dispatcher`)."""

from __future__ import annotations

import asyncio
import signal

from prometheus_client import start_http_server

from splatq.services.webhook_dispatcher.dispatcher import Dispatcher
from splatq.services.webhook_dispatcher.metrics import DispatcherMetrics
from splatq.shared.engine.queue import JobQueue
from splatq.shared.logs import configure_logging
from splatq.shared.redis.client import connect
from splatq.shared.settings import Settings


async def run(settings: Settings) -> None:
    configure_logging(settings.log_level, settings.log_format, "dispatcher")
    redis = connect(settings.redis_url, client_name="splatq-dispatcher")
    if settings.metrics_port:
        start_http_server(settings.metrics_port)
    dispatcher = Dispatcher(JobQueue(redis, settings), metrics=DispatcherMetrics.create())
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, dispatcher.stop)
    try:
        await dispatcher.run()
    finally:
        await redis.aclose()


def main() -> None:
    asyncio.run(run(Settings.from_env()))


if __name__ == "__main__":
    main()
