"""A job's own event history (SSE, `Prefer: wait`): compact list items that rebuild the outbox's
payloads byte for byte, resumable by id, waking blocked readers without polling, and reading
the stream a release before kept."""

from __future__ import annotations

import asyncio
import time

from redis.asyncio import Redis

from splatq.shared.engine.events import EventType
from splatq.shared.engine.ids import partition_of
from splatq.shared.engine.queue import JobQueue
from splatq.shared.engine.queue_types import Finish
from splatq.shared.testing import WorkerFactory, wait_for_status
from tests.helpers import spec


async def _outbox(redis: Redis, queue: JobQueue, job_id: str) -> list[tuple[str, str]]:
    entries = await redis.xrange(queue.keys.events(partition_of(job_id)))
    return [(f["type"], f["payload"]) for _, f in entries if f.get("job_id") == job_id]


async def test_history_rebuilds_every_outbox_payload_and_resumes_from_each_id(
    queue: JobQueue, redis: Redis, start_worker: WorkerFactory
) -> None:
    result = await queue.enqueue(spec(sleep_s=0.1, order='A-17 "quoted"\t'))
    await start_worker()
    await wait_for_status(queue, result.job_id, {"completed"})
    history = await queue.job_history(result.job_id)
    assert [(kind, payload) for _, kind, payload in history] == await _outbox(
        redis, queue, result.job_id
    )
    assert len(history) >= 4  # queued, started, progress..., completed
    ids = [tuple(int(p) for p in i.split("-")) for i, _, _ in history]
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    for n, (sse_id, _, _) in enumerate(history):
        assert await queue.job_history(result.job_id, sse_id) == history[n + 1 :]
    assert await queue.job_history(result.job_id, count=2) == history[:2]
    # Items name events without the namespace they share (history.py puts it back).
    items = await redis.lrange(queue.keys.job_history(result.job_id), 0, -1)
    assert [i.split("\t")[1] for i in items] == [k.split(".", 1)[1] for _, k, _ in history]
    # No stream key per job: the history is a list, and nobody watched, so no wake stream.
    for key in [k async for k in redis.scan_iter(f"{queue.keys.job(result.job_id)}*")]:
        assert await redis.type(key) in ("hash", "list"), key
    assert not await redis.hexists(queue.keys.job(result.job_id), "watch")


async def test_a_blocked_reader_wakes_at_the_next_event_and_times_out_without_one(
    queue: JobQueue, redis: Redis
) -> None:
    job = await queue.enqueue(spec())
    queued = await queue.job_history(job.job_id)
    began = time.monotonic()
    assert await queue.job_history(job.job_id, queued[-1][0], block_ms=300) == []
    assert 0.25 <= time.monotonic() - began < 2.0
    assert await redis.hexists(queue.keys.job(job.job_id), "watch")  # registered to be woken

    async def cancel_soon() -> None:
        await asyncio.sleep(0.2)
        await queue.cancel(job.job_id)

    canceling = asyncio.create_task(cancel_soon())
    began = time.monotonic()
    woken = await queue.job_history(job.job_id, queued[-1][0], block_ms=10_000)
    await canceling
    assert [kind for _, kind, _ in woken] == ["3d_reconstruction.canceled"]
    assert time.monotonic() - began < 5.0  # woken by the event, not by the 10 s timeout


async def test_a_reader_of_a_job_that_is_gone_waits_out_its_block(queue: JobQueue) -> None:
    began = time.monotonic()
    assert await queue.job_history("job_00000000000000000000000000000", block_ms=200) == []
    assert time.monotonic() - began >= 0.15  # a reader's loop does not spin


async def test_progress_stops_being_kept_past_the_bound_but_the_terminal_event_is_kept(
    queue: JobQueue, redis: Redis
) -> None:
    job = await queue.enqueue(spec())
    key = queue.keys.job_history(job.job_id)
    await redis.rpush(key, *["1\t3d_reconstruction.progress\tevt_x\t"] * 999)
    assert await redis.llen(key) == 1000
    taken = await queue.take(partition_of(job.job_id), {}, 1, "w1")
    started = [t for t in taken if t.outcome == "started"]
    assert len(started) == 1
    assert await redis.llen(key) == 1001  # a state change is always kept
    await queue.report_progress(job.job_id, started[0].token, 0.5, "reconstruct", True)
    assert await redis.llen(key) == 1001  # progress past the bound is not (the outbox has it)
    assert (await _outbox(redis, queue, job.job_id))[-1][0] == "3d_reconstruction.progress"
    run = started[0]
    done = Finish(
        job.job_id,
        run.entry.stream,
        run.entry.entry_id,
        run.token,
        "completed",
        event=EventType.COMPLETED.value,
    )
    assert (await queue.finish_many([done]))[0][0] == "ok"
    assert await redis.llen(key) == 1002
    last = (await queue.job_history(job.job_id, "2-0"))[-1]
    assert last[1] == "3d_reconstruction.completed"
    assert last[0].endswith("-1002")
    assert len(await queue.job_history(job.job_id, count=5000)) == 1002


async def test_a_job_from_the_release_before_reads_its_stream_then_its_list(
    queue: JobQueue, redis: Redis
) -> None:
    """A job enqueued before the upgrade kept its history in a stream `<job>:events`; its
    later events go to the list. A reader sees both, in order, and resumes across them."""
    job = await queue.enqueue(spec())
    hist = queue.keys.job_history(job.job_id)
    await redis.delete(hist)
    legacy = queue.keys.job_events(job.job_id)
    old_payload = '{"event":"3d_reconstruction.queued","legacy":true}'
    old_id = await redis.xadd(
        legacy, {"type": "3d_reconstruction.queued", "payload": old_payload}, id="1000-0"
    )
    await queue.cancel(job.job_id)
    history = await queue.job_history(job.job_id)
    assert next((i, k) for i, k, _ in history) == (old_id, "3d_reconstruction.queued")
    assert history[0][2] == old_payload
    assert [k for _, k, _ in history] == ["3d_reconstruction.queued", "3d_reconstruction.canceled"]
    assert await queue.job_history(job.job_id, old_id) == history[1:]
    assert await queue.job_history(job.job_id, history[1][0]) == []
