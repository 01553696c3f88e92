"""Redis itself stalls (SIGSTOP) longer than the lease TTL while real worker processes run
jobs: the outage is not the jobs' fault, so none of them is re-run."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from redis.asyncio import Redis

from splatq.shared.engine.queue import JobQueue
from splatq.shared.redis.client import connect
from splatq.shared.redis.server import RedisServer
from splatq.shared.testing import (
    engine_settings,
    job_events,
    running_redis_server,
    wait_for_status,
)
from tests.faultproxy import FaultProxy
from tests.handlers import runs_key
from tests.helpers import spec
from tests.system.conftest import SpawnWorker

pytestmark = pytest.mark.slow

TTL_MS = 1500


@pytest.fixture
async def stallable(tmp_path: Path) -> AsyncIterator[RedisServer]:
    """A redis-server of this test alone: the test freezes it."""
    async with running_redis_server(tmp_path / "redis") as server:
        yield server
        if server.process is not None:
            server.process.send_signal(signal.SIGCONT)


async def _eight_jobs_through(
    server: RedisServer,
    spawn_worker: SpawnWorker,
    worker_url: str,
    fault: Callable[[], Awaitable[None]],
) -> None:
    """Two worker processes (reaching Redis at `worker_url`) run eight 4 s jobs; `fault` is
    applied once every job is processing. Every job must complete after one run, one
    attempt and one `completed` event."""
    client: Redis = connect(server.url)
    try:
        queue = JobQueue(client, engine_settings(server.url, lease_ttl_ms=TTL_MS))
        await queue.setup()
        jobs = [await queue.enqueue(spec("full", sleep_s=4)) for _ in range(8)]
        for _ in range(2):
            spawn_worker(worker_url, SPLATQ_LEASE_TTL_MS=str(TTL_MS))
        for j in jobs:
            await wait_for_status(queue, j.job_id, {"processing"}, timeout=30)
        await fault()
        for j in jobs:
            done = await wait_for_status(queue, j.job_id, {"completed", "failed"}, timeout=60)
            assert done.status.value == "completed", done.error
            assert done.attempts == 1
            assert int(await client.get(runs_key(j.job_id)) or 0) == 1
            events = await job_events(client, queue, j.job_id)
            assert events.count("3d_reconstruction.completed") == 1
    finally:
        await client.aclose()


async def test_redis_stalled_past_the_lease_five_times_reruns_no_job(
    stallable: RedisServer, spawn_worker: SpawnWorker
) -> None:
    """Redis SIGSTOPped for 2.2 s (lease TTL 1.5 s) five times while two worker processes run
    eight 4 s jobs: every job completes after one run, one attempt, one `completed` event."""

    async def stall_five_times() -> None:
        assert stallable.process is not None
        for _ in range(5):
            stallable.process.send_signal(signal.SIGSTOP)
            await asyncio.sleep(2.2)
            stallable.process.send_signal(signal.SIGCONT)
            await asyncio.sleep(0.8)

    await _eight_jobs_through(stallable, spawn_worker, stallable.url, stall_five_times)


async def test_redis_unreachable_past_the_lease_five_times_reruns_no_job(
    stallable: RedisServer, spawn_worker: SpawnWorker
) -> None:
    """Every worker's connection to Redis is cut and refused for 2.2 s (lease TTL 1.5 s),
    five times, while two worker processes run eight 4 s jobs: whichever worker reaches
    Redis first afterwards, no lease counts the outage, and every job completes after one
    run and one attempt."""
    proxy = FaultProxy(stallable.port)
    await proxy.start()

    async def cut_five_times() -> None:
        for _ in range(5):
            proxy.outage(2.2)
            await asyncio.sleep(3.0)

    try:
        await _eight_jobs_through(stallable, spawn_worker, proxy.url, cut_five_times)
    finally:
        await proxy.stop()
