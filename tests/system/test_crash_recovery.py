"""Killing real worker processes (SIGKILL, SIGTERM) and restarting Redis mid-run."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from redis.asyncio import Redis

from splatq.shared.engine.queue import JobQueue
from splatq.shared.redis.client import connect
from splatq.shared.redis.server import RedisServer
from splatq.shared.testing import engine_settings, eventually, job_events, wait_for_status
from tests.helpers import spec
from tests.system.conftest import SpawnWorker

pytestmark = pytest.mark.slow


async def _exited(proc: object) -> None:
    import subprocess  # noqa: PLC0415

    assert isinstance(proc, subprocess.Popen)

    async def gone() -> bool:
        return proc.poll() is not None

    await eventually(gone, timeout=20)


async def test_sigkilled_worker_job_completes_exactly_once_on_another_worker(
    queue: JobQueue, redis: Redis, redis_server: RedisServer, spawn_worker: SpawnWorker
) -> None:
    """SIGKILL mid-job: another worker completes it once, within lease TTL + reaper interval
    (+ scheduling slack), and the completed event is appended exactly once."""
    result = await queue.enqueue(spec(sleep_s=2))
    victim = spawn_worker(redis_server.url)

    async def counted_once() -> bool:  # the handler is running: truly mid-job
        return int(await redis.get(f"test:runs:{result.job_id}") or 0) == 1

    await eventually(counted_once, timeout=15)
    survivor = spawn_worker(redis_server.url)
    victim.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()

    async def restarted() -> bool:
        return int(await redis.get(f"test:runs:{result.job_id}") or 0) == 2

    await eventually(restarted, timeout=15)
    recovery_s = time.monotonic() - killed_at
    # TTL 0.9 s + reaper 0.2 s; the survivor's own startup is part of the slack.
    assert recovery_s < 0.9 + 0.2 + 3.0, recovery_s
    job = await wait_for_status(queue, result.job_id, {"completed"}, timeout=15)
    assert job.attempts == 2
    assert job.deliveries == 2
    types = await job_events(redis, queue, result.job_id)
    assert types.count("3d_reconstruction.completed") == 1
    assert survivor.poll() is None


async def test_poison_job_is_dead_lettered_after_max_deliveries(
    queue: JobQueue, redis: Redis, redis_server: RedisServer, spawn_worker: SpawnWorker
) -> None:
    """A job that kills every worker that runs it is dead-lettered after
    SPLATQ_MAX_DELIVERIES (3) deliveries, with its reason; the job reads failed/dead_lettered
    and a healthy job submitted alongside still completes."""
    poison = await queue.enqueue(spec(crash=True))
    for _ in range(3):
        proc = spawn_worker(redis_server.url, SPLATQ_WORKER_CONCURRENCY="1")
        await _exited(proc)
    assert int(await redis.get(f"test:runs:{poison.job_id}") or 0) == 3
    healthy = await queue.enqueue(spec())
    spawn_worker(redis_server.url)
    job = await wait_for_status(queue, poison.job_id, {"failed"}, timeout=15)
    assert job.error is not None
    assert (job.error.code, job.error.retryable) == ("dead_lettered", False)
    dlq = await redis.xrange(queue.keys.dead_letters(0))
    assert len(dlq) == 1
    fields = dlq[0][1]
    assert fields["job"] == poison.job_id
    assert fields["reason"] == "max_deliveries_exceeded"
    assert fields["deliveries"] == "3"
    assert (await job_events(redis, queue, poison.job_id))[-1] == "3d_reconstruction.failed"
    await wait_for_status(queue, healthy.job_id, {"completed"}, timeout=15)
    assert int(await redis.get(f"test:runs:{poison.job_id}") or 0) == 3


async def test_sigterm_drains_without_burning_an_attempt(
    queue: JobQueue, redis: Redis, redis_server: RedisServer, spawn_worker: SpawnWorker
) -> None:
    """SIGTERM: the short job finishes, the long one is released (attempt not counted),
    the process exits 0, and the next worker completes the released job on attempt 1."""
    short = await queue.enqueue(spec(sleep_s=0.5))
    long = await queue.enqueue(spec(sleep_s=60))
    proc = spawn_worker(redis_server.url, SPLATQ_SHUTDOWN_GRACE_S="1.5")
    for job_id in (short.job_id, long.job_id):
        await wait_for_status(queue, job_id, {"processing"}, timeout=15)
    proc.send_signal(signal.SIGTERM)
    await _exited(proc)
    assert proc.returncode == 0
    assert (await queue.get(short.job_id)).status == "completed"  # type: ignore[union-attr]
    released = await queue.get(long.job_id)
    assert released is not None
    assert (released.status, released.attempts, released.deliveries) == ("queued", 0, 0)
    await redis.hset(queue.keys.job(long.job_id), "metadata", '{"sleep_s": 0.1}')
    spawn_worker(redis_server.url)
    job = await wait_for_status(queue, long.job_id, {"completed"}, timeout=15)
    assert job.attempts == 1


@pytest.fixture
async def aof_redis(tmp_path: Path) -> AsyncIterator[RedisServer]:
    """A Redis of this test's own, AOF fsynced on every write, so it can be restarted."""
    server = RedisServer(tmp_path / "redis", appendonly=True, appendfsync="always")
    await server.start()
    yield server
    await server.kill()


async def test_redis_restart_mid_run_loses_no_accepted_job(
    aof_redis: RedisServer, spawn_worker: SpawnWorker
) -> None:
    """200 accepted jobs, Redis shut down and restarted (AOF) while workers run: every job
    completes exactly once (one completed event each)."""
    settings = engine_settings(aof_redis.url)
    client = connect(aof_redis.url)
    queue = JobQueue(client, settings)
    await queue.setup()
    ids = [(await queue.enqueue(spec(sleep_s=0.05))).job_id for _ in range(200)]
    spawn_worker(aof_redis.url)
    spawn_worker(aof_redis.url)

    async def some_done() -> bool:
        return (await queue.get(ids[20])) is not None and (
            await queue.get(ids[20])
        ).status == "completed"  # type: ignore[union-attr]

    await eventually(some_done, timeout=30)
    await aof_redis.stop()  # SIGTERM: SHUTDOWN with AOF fsync
    await asyncio.sleep(1.0)  # workers see connection errors meanwhile
    await aof_redis.start()

    async def all_completed() -> bool:
        jobs = [await queue.get(i) for i in ids]
        return all(j is not None and j.status == "completed" for j in jobs)

    await eventually(all_completed, timeout=60, interval=0.2)
    entries = await client.xrange(queue.keys.events(0))
    completed = [f["job_id"] for _, f in entries if f["type"].endswith(".completed")]
    assert sorted(completed) == sorted(ids)
    await client.aclose()


async def test_a_fleet_of_one_restarted_takes_its_job_over_within_a_lease(
    queue: JobQueue, redis: Redis, redis_server: RedisServer, spawn_worker: SpawnWorker
) -> None:
    """The only worker is SIGKILLed and a new one starts 3 s later. Nobody ticked the fleet
    clock meanwhile, so the gap counts as an outage, which postpones the takeover by at most
    one lease TTL after the new worker first reaches Redis: the job is re-run within
    TTL + reaper interval + start-up of the new worker."""
    result = await queue.enqueue(spec(sleep_s=30))
    victim = spawn_worker(redis_server.url)

    def runs_are(n: int) -> Callable[[], Awaitable[bool]]:
        async def check() -> bool:
            return int(await redis.get(f"test:runs:{result.job_id}") or 0) == n

        return check

    # The handler has counted its run (status `processing` alone comes before the handler
    # starts: on a loaded machine a kill right after it can land before the first count).
    await eventually(runs_are(1), timeout=15)
    victim.send_signal(signal.SIGKILL)
    await _exited(victim)
    await asyncio.sleep(3.0)
    started = time.monotonic()
    spawn_worker(redis_server.url)
    restarted = runs_are(2)

    await eventually(restarted, timeout=20)
    takeover_s = time.monotonic() - started
    # TTL 0.9 s (the outage credit) + TTL 0.9 s + reaper 0.2 s, plus the worker's start-up.
    assert takeover_s < 0.9 + 0.9 + 0.2 + 4.0, takeover_s
    print(f"fleet-of-one takeover after restart: {takeover_s:.2f} s")
