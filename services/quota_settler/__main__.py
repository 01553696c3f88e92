"""`python -m splatq.services.quota_settler`: the quota settler (as `splatq settler`)."""

from __future__ import annotations

import asyncio
import signal

from splatq.services.quota_settler.settler import Settler
from splatq.shared.engine.metrics import register_build_info
from splatq.shared.engine.queue import JobQueue
from splatq.shared.liveness import health_endpoint
from splatq.shared.logs import configure_logging
from splatq.shared.redis.client import connect
from splatq.shared.settings import Settings
from splatq.shared.tenants.quota import QuotaBook


async def run(settings: Settings) -> None:
    configure_logging(settings.log_level, settings.log_format, "settler")
    register_build_info(service="settler")
    redis = connect(settings.redis_url, client_name="splatq-settler")
    settler = Settler(JobQueue(redis, settings), QuotaBook(redis))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, settler.stop)
    try:
        async with health_endpoint(settings.metrics_port, settings.liveness_max_age_s):
            await settler.run()
    finally:
        await redis.aclose()


def main() -> None:
    asyncio.run(run(Settings.from_env()))


if __name__ == "__main__":
    main()
