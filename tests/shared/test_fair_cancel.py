"""A cancel storm against the fair feed (issue #21, item 6): a tenant that cancels hundreds of
waiting jobs costs the other tenants nothing -- the next take, or an idle worker at once,
starts their work -- and the canceling tenant's place in the round-robin is left clean."""

from __future__ import annotations

import asyncio
from typing import Any

from redis.asyncio import Redis

from splatq.shared.engine.events import EventType
from splatq.shared.engine.fairness import TenantPolicy
from splatq.shared.engine.ids import new_event_id
from splatq.shared.engine.jobs import JobSpec
from splatq.shared.engine.keys import StreamName
from splatq.shared.engine.queue import JobQueue, delayed_member
from splatq.shared.engine.scripts import Script, ScriptCall
from splatq.shared.testing import WorkerFactory, eventually, wait_for_status
from tests.shared.test_fairness import assert_bookkeeping_clean, complete, full, take_one

INT = StreamName.INTERACTIVE
STORM = 600


def preview(tenant: str, n: int = 0) -> JobSpec:
    return JobSpec(tenant=tenant, quality="preview", metadata={"n": n})


async def _enqueue_many(queue: JobQueue, tenant: str, count: int) -> list[str]:
    ids: list[str] = []
    for start in range(0, count, 200):
        replies = await asyncio.gather(
            *(queue.enqueue(preview(tenant, i)) for i in range(start, min(count, start + 200)))
        )
        ids.extend(r.job_id for r in replies)
    return ids


async def _cancel_all(queue: JobQueue, ids: list[str]) -> None:
    for start in range(0, len(ids), 200):
        outcomes = await asyncio.gather(*(queue.cancel(i) for i in ids[start : start + 200]))
        assert set(outcomes) == {"canceled"}


async def _storm(queue: JobQueue) -> list[str]:
    """Tenant A's STORM previews, all canceled while they wait in its fair queue."""
    ids = await _enqueue_many(queue, "A", STORM)
    # nothing of A may have been fed: a stream entry of A's would be a ready entry instead
    assert await queue.redis.xlen(queue.keys.stream(0, INT)) == 1  # the one kept ready
    await _cancel_all(queue, ids)
    return ids


async def test_a_cancel_storm_does_not_hold_up_the_next_take(redis: Redis, queue: JobQueue) -> None:
    """600 canceled waiting jobs of A, then one of B: the very next take (one free slot) starts
    B's job. Before cancels withdrew waiting jobs, every dead entry of A spent one of the
    feed's bounded turns and kept A at the head of the ring, so takes started nothing."""
    await _storm(queue)
    base = queue.keys.fair_base(0, INT)
    # A's queue is gone at cancel time, and so is its place in the ring and its state
    assert await redis.llen(queue.keys.fair_queue(0, INT, "A")) == 0
    assert "A" not in await redis.lrange(f"{base}:ring", 0, -1)
    assert not [f for f in await redis.hkeys(f"{base}:state") if f.endswith(":A")]
    assert await redis.zcard(queue.keys.fair_waiting(0, INT)) == 0
    b = (await queue.enqueue(preview("B"))).job_id
    # A's one ready entry (fed before the storm) is dropped by the first take, which then reads
    # B's: at most two takes, whatever the storm's size.
    started: list[str] = []
    for _ in range(2):
        started.extend(t.job.id for t in await take_one(queue) if t.job is not None)
        if started:
            break
    assert started == [b]


async def test_an_idle_worker_starts_the_next_tenants_job_at_once(
    queue: JobQueue, start_worker: WorkerFactory
) -> None:
    """The user-visible symptom: an idle worker (a long blocking read, 30 s) starts B's job
    within a moment of its submission after A's cancel storm; before, B waited seconds per
    hundred canceled jobs (one fetch block per bounded feed)."""
    await _storm(queue)
    worker = await start_worker(fetch_block_ms=30_000)
    stream_key = queue.keys.stream(0, INT)

    async def blocked() -> bool:
        # the worker has read the stream (its consumer exists) and holds nothing
        consumers = await queue.redis.xinfo_consumers(stream_key, queue.group)
        return bool(consumers) and worker.pool.capacities()[INT] > 0

    await eventually(blocked, timeout=10)
    b = (await queue.enqueue(preview("B"))).job_id
    job = await wait_for_status(queue, b, {"completed"}, timeout=3)
    assert job.started_at_ms is not None
    assert job.started_at_ms - job.created_at_ms < 2000


async def test_dead_entries_left_from_before_withdrawal_spend_no_turns(
    redis: Redis, queue: JobQueue
) -> None:
    """Entries of jobs canceled before cancels withdrew them (no `fq_flow`/`fq_cost` on the
    record: queued by an older version) still sit in the tenant's queue; the feed drops them
    without spending turns (up to its drop budget), so the first take feeds B's job."""
    ids = await _enqueue_many(queue, "A", STORM)
    for start in range(0, STORM, 200):
        pipe = redis.pipeline(transaction=False)
        for job_id in ids[start : start + 200]:
            pipe.hdel(queue.keys.job(job_id), "fq_flow", "fq_cost")
        await pipe.execute()
    await _cancel_all(queue, ids)
    assert await redis.llen(queue.keys.fair_queue(0, INT, "A")) == STORM - 1  # dead entries
    b = (await queue.enqueue(preview("B"))).job_id
    started = [t.job.id for t in await take_one(queue) if t.job is not None]
    assert await redis.llen(queue.keys.fair_queue(0, INT, "A")) == 0  # dropped in one feed
    if not started:  # the first take read A's one ready entry (canceled) and dropped it
        started = [t.job.id for t in await take_one(queue) if t.job is not None]
    assert started == [b]


async def test_a_capped_tenant_emptied_by_cancels_leaves_no_ring_state(
    redis: Redis, queue: JobQueue
) -> None:
    """A capped at 1: one job runs, the feed parks A at its cap, its 3 waiting jobs are
    canceled. Its queue, ring place, deficit and settings go at once; its running count stays
    until the running job ends, which does not put an empty tenant back in the ring; a new
    job of A is served as usual."""
    cap = TenantPolicy(max_running=1)
    ids = [(await queue.enqueue(preview("A", i), policy=cap)).job_id for i in range(4)]
    [running] = await take_one(queue)
    assert running.job is not None
    assert running.job.id == ids[0]
    assert await take_one(queue) == []  # A is at its cap: parked
    base = queue.keys.fair_base(0, INT)
    assert await redis.hget(f"{base}:state", "a:A") == "capped"
    for job_id in ids[1:]:
        assert await queue.cancel(job_id) == "canceled"
    assert await redis.hgetall(f"{base}:state") == {"r:A": "1"}
    assert await redis.llen(f"{base}:ring") == 0
    await complete(queue, [running])
    await assert_bookkeeping_clean(redis, queue)
    again = (await queue.enqueue(preview("A", 9), policy=cap)).job_id
    assert [t.job.id for t in await take_one(queue) if t.job is not None] == [again]


async def test_canceling_some_waiting_jobs_keeps_the_tenant_in_line(
    redis: Redis, queue: JobQueue
) -> None:
    """Cancels that leave work in A's queue keep A in the ring with its deficit; the feed
    serves A's remaining job on that deficit, then B's, and ends clean."""
    a = [(await queue.enqueue(full("A", i))).job_id for i in range(5)]
    b = [(await queue.enqueue(full("B", i))).job_id for i in range(2)]
    for job_id in (a[1], a[2], a[4]):
        assert await queue.cancel(job_id) == "canceled"
    base = queue.keys.fair_base(0, StreamName.SYNTHESIS)
    assert "A" in await redis.lrange(f"{base}:ring", 0, -1)
    # A's turn credit (earned when its first job was fed at enqueue) survives the cancels
    assert await redis.hget(f"{base}:state", "d:A") == "10"
    taken = []
    for _ in range(5):
        taken.extend(await take_one(queue))
    assert [t.job.id for t in taken if t.job is not None] == [a[0], a[3], b[0], b[1]]
    await complete(queue, taken)
    await assert_bookkeeping_clean(redis, queue)


async def _snapshot(redis: Redis) -> dict[str, Any]:
    """Every key's type and content, replay memos aside."""
    out: dict[str, Any] = {}
    async for key in redis.scan_iter(count=1000):
        if ":replay:" in key:
            continue
        kind = await redis.type(key)
        if kind == "hash":
            out[key] = await redis.hgetall(key)
        elif kind == "list":
            out[key] = await redis.lrange(key, 0, -1)
        elif kind == "zset":
            out[key] = await redis.zrange(key, 0, -1, withscores=True)
        elif kind == "stream":
            out[key] = await redis.xrange(key)
        elif kind == "set":
            out[key] = sorted(await redis.smembers(key))
        else:
            out[key] = await redis.get(key)
    return out


async def test_the_cancel_script_is_safe_to_replay(redis: Redis, queue: JobQueue) -> None:
    """cancel.lua run again -- a resend within the replay memo, or past it -- answers the same
    or `already_finished` and leaves every key as the first run left it."""
    ids = [(await queue.enqueue(preview("A", i), max_tenant_backlog=10)).job_id for i in range(3)]
    job_id = ids[2]  # waiting in A's queue (the first is the one ready entry)
    keys = [queue.keys.job(job_id), queue.keys.delayed(0), queue.keys.events(0)]
    args = [
        new_event_id(),
        queue.settings.events_maxlen,
        EventType.CANCELED.value,
        queue.settings.job_retention_ms,
        60_000,
        "",
        delayed_member(INT, job_id),
    ]
    call = ScriptCall(Script.CANCEL, keys, args)
    assert (await queue.scripts.run(call))[0] == "canceled"
    after_first = await _snapshot(redis)
    assert await redis.lrange(queue.keys.fair_queue(0, INT, "A"), 0, -1) == [f"{ids[1]} 1"]
    assert (await queue.scripts.run(call))[0] == "canceled"  # the memo's answer
    assert await _snapshot(redis) == after_first
    fresh = ScriptCall(Script.CANCEL, keys, args)  # a resend past the memo runs the body
    assert list(await queue.scripts.run(fresh)) == ["already_finished", "canceled"]
    assert await _snapshot(redis) == after_first


async def test_a_canceled_redrive_leaves_the_redrive_flow(redis: Redis, queue: JobQueue) -> None:
    """A redriven job waits in its tenant's redrive flow; canceled there, it leaves that flow's
    queue and the flow leaves the ring."""
    from splatq.shared.engine.queue import Finish  # noqa: PLC0415

    job_id = (await queue.enqueue(full("A"))).job_id
    [t] = await take_one(queue)
    await queue.finish_many([Finish(job_id, t.entry.stream, t.entry.entry_id, t.token, "failed")])
    await redis.xadd(queue.keys.dead_letters(0), {"job": job_id, "reason": "test"})
    [letter] = await queue.dead_letters(0)
    # a job of B keeps the stream's one ready entry, so the redrive waits in its flow
    other = (await queue.enqueue(full("B"))).job_id
    assert (await queue.redrive(letter))[0] == "redriven"
    flow = queue.keys.fair_queue(0, StreamName.SYNTHESIS, "redrive:A")
    assert await redis.llen(flow) == 1
    assert await queue.cancel(job_id) == "canceled"
    assert await redis.llen(flow) == 0
    base = queue.keys.fair_base(0, StreamName.SYNTHESIS)
    assert "redrive:A" not in await redis.lrange(f"{base}:ring", 0, -1)
    taken = await take_one(queue)
    assert [x.job.id for x in taken if x.job is not None] == [other]
    await complete(queue, taken)
    await assert_bookkeeping_clean(redis, queue)


async def test_withdrawal_from_either_end_keeps_the_rest_in_order(
    redis: Redis, queue: JobQueue
) -> None:
    """A cancel scans the tenant's queue from the end nearer its job: whichever end it picks,
    exactly the canceled entries leave and the rest keep their order."""
    ids = [(await queue.enqueue(preview("A", i))).job_id for i in range(40)]
    # ids[0] is the one ready entry; 39 wait. Tail, head, middle, near either end:
    order = [39, 1, 38, 20, 2, 30, 10, 35]
    for i in order:
        assert await queue.cancel(ids[i]) == "canceled"
    left = await redis.lrange(queue.keys.fair_queue(0, INT, "A"), 0, -1)
    assert left == [f"{j} 1" for n, j in enumerate(ids) if n > 0 and n not in order]
    assert await redis.zcard(queue.keys.fair_waiting(0, INT)) == len(left)
