"""A real `redis-server` for tests: a child process on a free loopback port, in a scratch
directory, without persistence; and clients that start from an empty database."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

from redis.asyncio import Redis

from splatq.shared.redis.client import connect
from splatq.shared.redis.server import RedisServer, RedisServerError, free_port

__all__ = ["RedisServer", "RedisServerError", "free_port", "fresh_redis", "running_redis_server"]


@contextlib.asynccontextmanager
async def running_redis_server(
    data_dir: Path | None = None, *, appendonly: bool = False
) -> AsyncIterator[RedisServer]:
    """Start `redis-server` (from PATH) on a free port and wait until it answers; stop it on
    exit. Without `data_dir` its files go to a temporary directory removed afterwards. The
    server dies with this process even if it is SIGKILLed. `appendonly=True` for tests that
    kill and restart it (`server.kill()`, `server.restart()`) and expect the data back."""
    with contextlib.ExitStack() as stack:
        if data_dir is None:
            data_dir = Path(
                stack.enter_context(tempfile.TemporaryDirectory(prefix="splatq-redis-"))
            )
        server = RedisServer(data_dir, appendonly=appendonly)
        await server.start()
        try:
            yield server
        finally:
            await server.stop()


@contextlib.asynccontextmanager
async def fresh_redis(url: str) -> AsyncIterator[Redis]:
    """A splatq client (`connect`) on `url` after FLUSHALL: one test's empty database. Closed
    on exit; the data stays for the next test's flush."""
    client = connect(url)
    try:
        await client.flushall()
        yield client
    finally:
        await client.aclose()
