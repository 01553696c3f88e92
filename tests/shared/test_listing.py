"""The engine's listing merge (shared/engine/listing.py) against a real Redis: a tenant whose
jobs crowd one partition of many is still listed in exact order across small per-partition
batches, page after page, with and without a status filter."""

from __future__ import annotations

from redis.asyncio import Redis

from splatq.shared.engine.jobs import JobSpec
from splatq.shared.engine.listing import JobFilter, Position, list_jobs
from splatq.shared.engine.queue import JobQueue
from splatq.shared.settings import Settings


async def _pages(queue: JobQueue, limit: int, job_filter: JobFilter) -> list[str]:
    ids: list[str] = []
    after: Position | None = None
    while True:
        page = await list_jobs(queue, "acme", limit, job_filter, after)
        ids.extend(j.id for j in page.jobs)
        if page.next is None:
            return ids
        after = page.next


async def test_one_crowded_partition_among_many_lists_in_order(
    redis: Redis, settings: Settings
) -> None:
    queue = JobQueue(redis, settings.with_overrides(partitions=8))
    await queue.setup()
    crowded = [k for k in (f"key-{i}" for i in range(400)) if queue.keys.partition_for(k) == 0]
    created = []
    for n, key in enumerate(crowded[:30]):  # all in partition 0: batches of 8 there
        spec = JobSpec(tenant="acme", quality="preview", idempotency_key=key, metadata={"n": n})
        created.append((await queue.enqueue(spec)).job_id)
    for _ in range(6):  # and a few spread at random
        created.append((await queue.enqueue(JobSpec(tenant="acme", quality="preview"))).job_id)
    newest_first = [
        j.id
        for j in sorted(
            [job for job in [await queue.get(i) for i in created] if job is not None],
            key=lambda j: (j.created_at_ms, j.id),
            reverse=True,
        )
    ]
    assert await _pages(queue, 20, JobFilter()) == newest_first
    assert await _pages(queue, 3, JobFilter()) == newest_first
    for job_id in created[::3]:
        await queue.cancel(job_id, "acme")
    canceled = [i for i in newest_first if i in set(created[::3])]
    assert await _pages(queue, 4, JobFilter(statuses=frozenset({"canceled"}))) == canceled
