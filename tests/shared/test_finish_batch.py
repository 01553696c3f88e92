"""Many exits from processing in one script call (finish_batch.lua): each job's finish logic
unchanged -- the fence, the resend answer -- and one job's error leaves its batch-mates
committed."""

from __future__ import annotations

from redis.asyncio import Redis

from splatq.shared.engine.events import EventType
from splatq.shared.engine.queue import JobQueue
from splatq.shared.engine.queue_types import Finish, Taken
from tests.helpers import spec


async def _started(queue: JobQueue, n: int) -> list[Taken]:
    for _ in range(n):
        await queue.enqueue(spec())
    taken = [t for p in range(queue.settings.partitions) for t in await queue.take(p, {}, n, "w1")]
    started = [t for t in taken if t.outcome == "started"]
    assert len(started) == n
    return started


def _done(t: Taken, token: str = "") -> Finish:
    assert t.job is not None
    return Finish(
        t.job.id, t.entry.stream, t.entry.entry_id, token or t.token, "completed",
        event=EventType.COMPLETED.value,
    )  # fmt: skip


async def test_a_batch_commits_each_job_fenced_and_answers_a_resend_alike(
    queue: JobQueue, redis: Redis
) -> None:
    runs = await _started(queue, 6)
    batch = [_done(t) for t in runs]
    batch[2] = _done(runs[2], token="not-this-run")
    calls_before = (await redis.info("commandstats")).get("cmdstat_evalsha", {}).get("calls", 0)
    first = await queue.finish_many(batch)
    calls = (await redis.info("commandstats"))["cmdstat_evalsha"]["calls"] - calls_before
    assert calls <= queue.settings.partitions  # one call per partition, not one per job
    assert [o for o, _ in first] == ["ok", "ok", "lease_lost", "ok", "ok", "ok"]
    assert await queue.finish_many(batch) == first  # a resend (a lost reply) answers alike
    statuses = [(await queue.get(t.entry.fields["job"])) for t in runs]
    assert [j.status.value for j in statuses if j] == [
        "completed", "completed", "processing", "completed", "completed", "completed",
    ]  # fmt: skip


async def test_one_jobs_error_inside_a_batch_leaves_the_others_committed(
    queue: JobQueue, redis: Redis
) -> None:
    runs = await _started(queue, 3)
    broken = runs[1].entry.fields["job"]
    await redis.delete(queue.keys.job(broken))
    await redis.set(queue.keys.job(broken), "not a hash")  # every read of it: WRONGTYPE
    out = await queue.finish_many([_done(t) for t in runs])
    assert out[0] == ("ok", "completed")
    assert out[2] == ("ok", "completed")
    assert out[1][0] == "error"
    assert "WRONGTYPE" in out[1][1]
