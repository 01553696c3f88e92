"""The worker runtime against a real Redis: leases, heartbeats, bad input, slots, draining."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from redis.asyncio import Redis

from splatq.shared.engine.job_context import JobContext
from splatq.shared.engine.jobs import JobOutcome, JobSpec
from splatq.shared.engine.keys import StreamName
from splatq.shared.engine.queue import JobQueue
from splatq.shared.engine.replies import Reply
from splatq.shared.testing import WorkerFactory, eventually, job_events, wait_for_status
from tests.helpers import spec


async def test_a_job_much_longer_than_its_lease_is_never_reclaimed(
    queue: JobQueue, redis: Redis, start_worker: WorkerFactory
) -> None:
    """Heartbeats keep a 4x-TTL job with its first worker even with another worker reaping,
    and its blocking work runs off the event loop so renewals are not starved."""
    ttl_s = queue.settings.lease_ttl_ms / 1000
    result = await queue.enqueue(spec(block_s=2 * ttl_s, sleep_s=2 * ttl_s))
    first = await start_worker()
    await wait_for_status(queue, result.job_id, {"processing"})
    await start_worker()  # a second worker whose reaper runs every 200 ms
    job = await wait_for_status(queue, result.job_id, {"completed"}, timeout=4 * ttl_s + 5)
    assert job.deliveries == 1
    assert job.attempts == 1
    assert int(await redis.get(f"test:runs:{job.id}") or 0) == 1
    assert (await redis.hget(queue.keys.job(job.id), "reclaims")) is None
    assert first.running_jobs == 0


async def test_malformed_entries_are_dead_lettered_and_the_worker_goes_on(
    queue: JobQueue, redis: Redis, start_worker: WorkerFactory
) -> None:
    """Missing fields, a bad id, another format version and an unknown job each land in the
    dead-letter stream with their reason; a valid job behind them still completes."""
    stream = queue.keys.stream(0, StreamName.INTERACTIVE)
    await redis.xadd(stream, {"garbage": "1"})
    await redis.xadd(stream, {"v": "1", "job": "../../etc/passwd"})
    await redis.xadd(stream, {"v": "99", "job": "job_00001ARZ3NDEKTSV4RRFFQ69G5FAV"})
    await redis.xadd(stream, {"v": "1", "job": "job_00001ARZ3NDEKTSV4RRFFQ69G5FAV"})
    good = await queue.enqueue(spec())
    await start_worker()
    await wait_for_status(queue, good.job_id, {"completed"})
    dlq = await redis.xrange(queue.keys.dead_letters(0))
    reasons = sorted(f["reason"] for _, f in dlq)
    assert reasons == ["bad_job_id", "missing_fields", "unknown_job", "unsupported_version"]
    assert all(f["stream"] == "interactive" and f["detail"] for _, f in dlq)
    assert await redis.xlen(stream) == 0  # dead-lettered entries were acked and removed


async def test_interactive_jobs_start_promptly_behind_a_synthesis_flood(
    queue: JobQueue, start_worker: WorkerFactory
) -> None:
    """With every slot busy with long synthesis jobs, an interactive job still starts at once
    (no head-of-line blocking)."""
    flood = [await queue.enqueue(spec("full", sleep_s=4)) for _ in range(12)]
    await start_worker(worker_concurrency=4)

    async def all_slots_busy() -> bool:
        jobs = [await queue.get(f.job_id) for f in flood]
        return sum(1 for j in jobs if j and j.status == "processing") == 4

    await eventually(all_slots_busy, timeout=5)
    submitted = time.monotonic()
    quick = await queue.enqueue(spec("preview"))
    await wait_for_status(queue, quick.job_id, {"completed"}, timeout=3)
    assert time.monotonic() - submitted < 1.5  # not behind 4 s synthesis jobs


async def test_synthesis_uses_all_slots_when_interactive_is_idle(
    queue: JobQueue, start_worker: WorkerFactory
) -> None:
    """Only synthesis work: all 4 slots run synthesis jobs (reserved 1 + borrowed 3)."""
    flood = [await queue.enqueue(spec("full", sleep_s=2)) for _ in range(6)]
    await start_worker(worker_concurrency=4)

    async def four_running() -> bool:
        jobs = [await queue.get(f.job_id) for f in flood]
        return sum(1 for j in jobs if j and j.status == "processing") == 4

    await eventually(four_running, timeout=5)


async def test_graceful_stop_finishes_short_jobs_and_releases_long_ones(
    queue: JobQueue, redis: Redis, start_worker: WorkerFactory
) -> None:
    """On stop, a job that fits the grace period completes; one that does not is released
    (queued, attempt not counted) and another worker completes it with attempt 1."""
    short = await queue.enqueue(spec(sleep_s=0.5))
    long = await queue.enqueue(spec(sleep_s=30))
    worker = await start_worker(shutdown_grace_s=1.5)
    for job_id in (short.job_id, long.job_id):
        await wait_for_status(queue, job_id, {"processing"})
    worker.stop()
    await wait_for_status(queue, short.job_id, {"completed"}, timeout=5)
    released = await wait_for_status(queue, long.job_id, {"queued"}, timeout=5)
    assert released.attempts == 0
    assert released.deliveries == 0
    assert "3d_reconstruction.failed" not in await job_events(redis, queue, long.job_id)
    # the released job keeps its place and is picked up by the next worker's reaper
    await redis.hset(queue.keys.job(long.job_id), "metadata", '{"sleep_s": 0.1}')
    await start_worker()
    job = await wait_for_status(queue, long.job_id, {"completed"}, timeout=10)
    assert job.attempts == 1


async def test_scripts_are_reloaded_after_redis_forgets_them(
    queue: JobQueue, redis: Redis, start_worker: WorkerFactory
) -> None:
    """SCRIPT FLUSH (what a restart does to the script cache) costs nothing but a reload."""
    await start_worker()
    await redis.script_flush()
    result = await queue.enqueue(spec())
    await wait_for_status(queue, result.job_id, {"completed"})


async def test_every_script_call_stays_in_one_cluster_slot(
    queue: JobQueue, start_worker: WorkerFactory
) -> None:
    """Each Lua call's KEYS hash to one Redis Cluster slot, across a whole job lifecycle."""
    from redis.crc import key_slot  # noqa: PLC0415

    seen: list[list[str]] = []
    original = queue.scripts._execute

    async def recording(calls):  # type: ignore[no-untyped-def]
        seen.extend(list(c.keys) for c in calls)
        return await original(calls)

    queue.scripts._execute = recording  # type: ignore[method-assign]
    ok = await queue.enqueue(JobSpec(tenant="a", quality="preview", idempotency_key="x"))
    retried = await queue.enqueue(
        JobSpec(tenant="a", quality="full", metadata={"fail": "transient_once"})
    )
    await queue.cancel((await queue.enqueue(spec())).job_id)
    w = await start_worker()
    w.queue.scripts._execute = recording  # type: ignore[method-assign]
    for job_id in (ok.job_id, retried.job_id):
        await wait_for_status(queue, job_id, {"completed"})
    assert len(seen) >= 5
    for keys in seen:
        assert len({key_slot(k.encode()) for k in keys}) == 1, keys


async def test_lease_renewal_failure_stops_the_job_and_commits_nothing(
    queue: JobQueue, redis: Redis, start_worker: WorkerFactory
) -> None:
    """If another holder takes the lease, the old worker cancels its work and its result
    is never committed."""
    result = await queue.enqueue(spec(sleep_s=3))
    await start_worker()
    await wait_for_status(queue, result.job_id, {"processing"})
    await redis.set(queue.keys.lease(result.job_id), "someone-else", px=60_000)

    async def abandoned() -> bool:
        job = await queue.get(result.job_id)
        return job is not None and job.stage != "step-0" and job.status == "processing"

    await asyncio.sleep(queue.settings.heartbeat_interval_s * 2)
    await eventually(abandoned, timeout=3)
    job = await queue.get(result.job_id)
    assert job is not None
    assert job.status == "processing"
    assert job.artifacts is None
    assert "3d_reconstruction.completed" not in await job_events(redis, queue, result.job_id)


async def test_an_unreadable_job_record_fails_alone_and_the_worker_goes_on(
    queue: JobQueue, redis: Redis, start_worker: WorkerFactory
) -> None:
    """A job hash that cannot be parsed fails that job (permanent, with a code), not the
    worker: the next job still completes."""
    broken = await queue.enqueue(spec())
    await redis.hset(queue.keys.job(broken.job_id), "metadata", "{not json")
    good = await queue.enqueue(spec())
    await start_worker()
    job = await wait_for_status(queue, good.job_id, {"completed"})
    assert job.status == "completed"
    raw = await redis.hgetall(queue.keys.job(broken.job_id))
    assert raw["status"] == "failed"
    assert raw["error_code"] == "CORRUPT_JOB_RECORD"


async def _no_op(ctx: JobContext) -> JobOutcome:
    return JobOutcome()


async def test_a_short_take_is_not_followed_by_an_empty_one(
    queue: JobQueue, start_worker: WorkerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Interactive jobs only, so the synthesis reservation stays free: a take that fills the
    interactive slots and finds synthesis empty marks it drained, and the worker waits for a
    slot instead of calling take.lua again at once (which read nothing: one empty script call
    and round trip after every batch)."""
    n_jobs = 60
    taken_so_far = 0
    empty_while_waiting = 0  # takes that read no entry while jobs still waited to be taken
    take = JobQueue.take

    async def counting_take(self: JobQueue, *args: Any, **kwargs: Any) -> Any:
        nonlocal taken_so_far, empty_while_waiting
        taken = await take(self, *args, **kwargs)
        read = sum(t.outcome not in (Reply.HELD, Reply.DRAINED) for t in taken)
        if read == 0 and taken_so_far < n_jobs:
            empty_while_waiting += 1
        taken_so_far += read
        return taken

    monkeypatch.setattr(JobQueue, "take", counting_take)
    ids = [(await queue.enqueue(spec())).job_id for _ in range(n_jobs)]
    await start_worker(_no_op, worker_concurrency=10)  # 7 interactive slots, 3 synthesis
    for job_id in ids:
        await wait_for_status(queue, job_id, {"completed"})
    assert taken_so_far == n_jobs
    # Before, every batch was followed by an empty take (7 of them here).
    assert empty_while_waiting == 0
