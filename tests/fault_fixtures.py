"""Fixtures of the fault tests: a fault-injection proxy in front of the session's (flushed)
redis-server, a JobQueue talking through it, and a redis-server of one test alone (for tests
that change the server's configuration: maxmemory, REPLICAOF). Import them by name."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from splatq.shared.engine.queue import JobQueue
from splatq.shared.engine.scripts import LuaScript
from splatq.shared.redis.client import connect
from splatq.shared.redis.server import RedisServer
from splatq.shared.settings import Settings
from splatq.shared.testing import running_redis_server
from tests.faultproxy import FaultProxy


@pytest.fixture
async def proxy(redis: Redis, redis_server: RedisServer) -> AsyncIterator[FaultProxy]:
    """A proxy in front of the session's (flushed) redis-server."""
    p = FaultProxy(redis_server.port)
    await p.start()
    yield p
    await p.stop()


@pytest.fixture
async def proxied(proxy: FaultProxy, settings: Settings) -> AsyncIterator[JobQueue]:
    """A JobQueue whose every command goes through the proxy."""
    client = connect(proxy.url)
    q = JobQueue(client, settings.with_overrides(redis_url=proxy.url))
    await q.setup()
    yield q
    await client.aclose()


@pytest.fixture
async def own_server(tmp_path: Path) -> AsyncIterator[RedisServer]:
    """A redis-server of this test alone (it changes server configuration)."""
    async with running_redis_server(tmp_path / "redis") as server:
        yield server


def sha(queue: JobQueue, script: LuaScript) -> bytes:
    """The SHA1 of a loaded script: the byte pattern that names it in an EVALSHA."""
    return queue.scripts.sha(script).encode()
