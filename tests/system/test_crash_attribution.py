"""Worker deaths are charged to the jobs they interrupt only in part: real worker processes
SIGKILLed over and over while healthy jobs run, and a real poison job among healthy ones."""

from __future__ import annotations

import asyncio
import signal
import subprocess

import pytest
from redis.asyncio import Redis

from splatq.shared.engine.queue import JobQueue
from splatq.shared.redis.server import RedisServer
from splatq.shared.testing import eventually, wait_for_status
from tests.helpers import spec
from tests.system.conftest import SpawnWorker

pytestmark = pytest.mark.slow


async def _all_terminal(queue: JobQueue, ids: list[str]) -> bool:
    for job_id in ids:
        job = await queue.get(job_id)
        if job is None or job.status.value not in {"completed", "failed", "canceled"}:
            return False
    return True


async def test_workers_killed_again_and_again_dead_letter_no_healthy_job(
    queue: JobQueue, redis: Redis, redis_server: RedisServer, spawn_worker: SpawnWorker
) -> None:
    """Two workers (4 slots each) SIGKILLed alternately every 3 s, and restarted, until 40
    healthy 1.2 s jobs are done: none is dead-lettered (SPLATQ_MAX_DELIVERIES 3), because a
    death beside k jobs charges each only 1/k."""
    ids = [(await queue.enqueue(spec(sleep_s=1.2))).job_id for _ in range(40)]
    workers: list[subprocess.Popen[bytes]] = [spawn_worker(redis_server.url) for _ in range(2)]
    kills = 0
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 150
    while not await _all_terminal(queue, ids):
        assert loop.time() < deadline, "jobs did not finish"
        await asyncio.sleep(3.0)
        victim = kills % 2
        workers[victim].send_signal(signal.SIGKILL)
        workers[victim].wait(timeout=10)
        workers[victim] = spawn_worker(redis_server.url)
        kills += 1
    assert kills >= 3  # the fleet really was killed repeatedly
    jobs = [await queue.get(i) for i in ids]
    failed = [j for j in jobs if j is not None and j.status.value != "completed"]
    lapses = [await redis.hget(queue.keys.job(j.id), "lapses") for j in failed]
    assert failed == [], [(j.id, j.error, lapses) for j in failed]
    assert max(j.deliveries for j in jobs if j is not None) > 1  # deaths did interrupt jobs


async def test_a_poison_job_alone_at_each_death_is_dead_lettered_beside_healthy_work(
    queue: JobQueue, redis: Redis, redis_server: RedisServer, spawn_worker: SpawnWorker
) -> None:
    """A job that kills its worker process, in a fleet of two one-slot workers restarted
    after every death, with healthy jobs flowing beside it: alone on its worker at every
    death, it is charged in full each time and dead-lettered at the limit (3) with every
    death explained; every healthy job completes with nothing charged."""
    poison = (await queue.enqueue(spec(crash_after_s=0.3))).job_id
    healthy = [(await queue.enqueue(spec(sleep_s=0.2))).job_id for _ in range(8)]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 120
    one_slot = {"SPLATQ_WORKER_CONCURRENCY": "1"}
    workers = [spawn_worker(redis_server.url, **one_slot) for _ in range(2)]
    while not await _all_terminal(queue, [poison, *healthy]):
        assert loop.time() < deadline, "jobs did not finish"
        for i, w in enumerate(workers):
            if w.poll() is not None:
                workers[i] = spawn_worker(redis_server.url, **one_slot)
        await asyncio.sleep(0.2)
    job = await wait_for_status(queue, poison, {"failed"})
    assert job.error is not None
    assert job.error.code == "dead_lettered"
    assert job.delivery_charge == pytest.approx(3.0)
    [(_, letter)] = await redis.xrange(queue.keys.dead_letters(0))
    assert letter["job"] == poison
    assert letter["reason"] == "max_deliveries_exceeded"
    assert letter["charge"] == "3.00"
    deaths = [d.split() for d in letter["lapses"].split(";") if d]
    assert len(deaths) == 3
    assert all(k == "1" for _, _, k in deaths)  # alone on its worker every time
    for job_id in healthy:
        done = await queue.get(job_id)
        assert done is not None
        assert done.status.value == "completed", done.error
        assert done.delivery_charge == 0


async def test_workers_dying_together_charge_their_jobs_nothing_past_the_first_death(
    queue: JobQueue, redis: Redis, redis_server: RedisServer, spawn_worker: SpawnWorker
) -> None:
    """Two workers holding two jobs each are SIGKILLed at the same instant (a node drain, a
    spot reclaim): a mass death is not evidence against any one job. Every interrupted job is
    logged as `mass` and charged nothing (2.0 in all without the rule)."""
    two_slots = {"SPLATQ_WORKER_CONCURRENCY": "2"}
    victims = [spawn_worker(redis_server.url, **two_slots) for _ in range(2)]
    ids = [(await queue.enqueue(spec(first_sleep_s=60))).job_id for _ in range(4)]

    async def all_processing() -> bool:  # every job running on a victim
        jobs = [await queue.get(i) for i in ids]
        return all(j is not None and j.status.value == "processing" for j in jobs)

    loop = asyncio.get_running_loop()
    deadline = loop.time() + 90
    await eventually(all_processing, 90, 0.1, message="the victims starting the jobs")
    holders = {await redis.hget(queue.keys.job(i), "worker") for i in ids}
    assert len(holders) == 2
    survivor = spawn_worker(redis_server.url, SPLATQ_WORKER_CONCURRENCY="8")

    async def joined() -> bool:  # the survivor ticks the fleet clock
        return await redis.zcard(queue.keys.workers(0)) >= 3

    await eventually(joined, max(deadline - loop.time(), 0), 0.1, message="the survivor joining")
    for v in victims:
        v.send_signal(signal.SIGKILL)
    for v in victims:
        v.wait(timeout=10)
    done = [await wait_for_status(queue, i, {"completed"}, timeout=60) for i in ids]
    assert survivor.poll() is None
    assert all(j.deliveries == 2 for j in done)
    lapses = [await redis.hget(queue.keys.job(i), "lapses") for i in ids]
    assert all(entry and entry.endswith(" 2 mass+1;") for entry in lapses), lapses
    assert [j.delivery_charge for j in done] == [0, 0, 0, 0]
