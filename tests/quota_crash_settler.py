"""A quota settler that SIGKILLs itself at one step boundary of its first batch
(`python -m tests.quota_crash_settler read|applied|acked`); tests/system kills it there."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from splatq.services.quota_settler.settler import Boundary, Settler
from splatq.shared.engine.queue import JobQueue
from splatq.shared.redis.client import connect
from splatq.shared.settings import Settings
from splatq.shared.tenants.quota import QuotaBook


async def main(boundary: Boundary) -> None:
    settings = Settings.from_env()
    redis = connect(settings.redis_url)

    def at(reached: Boundary) -> None:
        if reached is boundary:
            os.kill(os.getpid(), signal.SIGKILL)

    await Settler(JobQueue(redis, settings), QuotaBook(redis), on_boundary=at).run()


if __name__ == "__main__":
    asyncio.run(main(Boundary(sys.argv[1])))
