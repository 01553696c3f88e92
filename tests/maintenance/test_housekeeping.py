"""expire_records on one Redis: terminal job records and idempotency claims that lost their
TTL get one (both kinds in the same SCAN pages), live records are left alone."""

from __future__ import annotations

from redis.asyncio import Redis

from splatq.shared.engine.jobs import JobSpec
from splatq.shared.engine.queue import JobQueue
from splatq.shared.maintenance.housekeeping import ExpireRecords
from splatq.shared.maintenance.schedule import Schedule
from tests.maintenance.helpers import run_task, scheduler_of


async def test_records_without_a_ttl_get_one_and_live_ones_are_left(
    queue: JobQueue, redis: Redis
) -> None:
    stale, live = [], []
    for i in range(12):
        result = await queue.enqueue(
            JobSpec(tenant="acme", quality="preview", idempotency_key=f"k{i}")
        )
        job = await queue.get(result.job_id)
        assert job is not None
        key = queue.keys.job(job.id)
        if i % 3:
            await redis.hset(key, "status", "completed")  # type: ignore[misc]
            await redis.persist(key)
            await redis.persist(job.claim_key)
            stale += [key, job.claim_key]
        else:
            live.append(key)  # queued: no TTL, and none is given
    task = ExpireRecords(queue, Schedule("41 * * * *"), batch=5)
    summary = await run_task(scheduler_of(queue, task), task.name)
    assert summary.startswith(f"{len(stale)} records given a TTL (")
    assert min([int(await redis.pttl(k)) for k in stale]) > 0
    assert {int(await redis.pttl(k)) for k in live} == {-1}
