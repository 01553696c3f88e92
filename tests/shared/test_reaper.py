"""The reaper on its own: lease-checked takeover, lost-entry alarms, consumer pruning."""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from redis.asyncio import Redis

from splatq.shared.engine.keys import StreamName
from splatq.shared.engine.metrics import EngineMetrics
from splatq.shared.engine.queue import JobQueue
from splatq.shared.engine.reaper import Reaper
from splatq.shared.testing import eventually
from tests.helpers import spec

STREAM = StreamName.INTERACTIVE


async def _deliver_to(queue: JobQueue, consumer: str) -> list[str]:
    taken = await queue.take(0, {STREAM: 10}, 10, consumer)
    return [t.entry.entry_id for t in taken if t.outcome == "started"]


async def test_entries_trimmed_while_pending_raise_the_lost_entry_alarm(
    queue: JobQueue, redis: Redis
) -> None:
    """An unacked entry deleted from the stream is reported: metric, counter key, no crash."""
    await queue.enqueue(spec())
    [entry_id] = await _deliver_to(queue, "dead-worker")
    await redis.delete(
        queue.keys.lease((await redis.xrange(queue.keys.stream(0, STREAM)))[0][1]["job"])
    )
    await redis.xdel(queue.keys.stream(0, STREAM), entry_id)  # what MAXLEN trimming does
    metrics = EngineMetrics.create(CollectorRegistry())
    reaper = Reaper(queue, "reaper", 0.0, metrics)

    async def idle_enough() -> bool:
        taken = await reaper.reap_stale_entries(0, STREAM, 5)
        assert taken == []
        return (await queue.partition_counts(0))["lost_entries"] == 1

    await eventually(idle_enough, timeout=5, interval=0.1)
    assert metrics.entries_lost_alarm.labels(STREAM.value)._value.get() == 1


async def test_an_idle_entry_with_a_live_lease_goes_back_to_its_holder(
    queue: JobQueue, redis: Redis
) -> None:
    """Idle time alone never decides: an entry whose job lease is alive is handed back."""
    result = await queue.enqueue(spec())
    await _deliver_to(queue, "slow-but-alive")
    reaper = Reaper(queue, "reaper", 0.0)
    lease = queue.keys.lease(result.job_id)

    async def past_idle_threshold() -> bool:
        await redis.pexpire(lease, 60_000)  # keep the lease alive, as heartbeats would
        assert await reaper.reap_stale_entries(0, STREAM, 5) == []
        reclaims = await redis.hget(queue.keys.job(result.job_id), "reclaims")
        assert reclaims is None
        pending = await redis.xpending_range(
            queue.keys.stream(0, STREAM), queue.group, "-", "+", 10
        )
        return (
            pending[0]["consumer"] == "slow-but-alive" and pending[0]["time_since_delivered"] < 500
        )

    await eventually(past_idle_threshold, timeout=5, interval=0.3)
    job = await queue.get(result.job_id)
    assert job is not None
    assert job.status == "processing"


async def test_dead_consumers_without_pending_entries_are_pruned(
    queue: JobQueue, redis: Redis
) -> None:
    """A consumer with no pending entries and long idle is deleted; one with pending is kept."""
    stream = queue.keys.stream(0, STREAM)
    await queue.enqueue(spec())
    await _deliver_to(queue, "has-pending")
    await redis.xgroup_createconsumer(stream, queue.group, "empty-and-gone")
    removed = await queue.prune_consumers(0, STREAM, idle_ms=0)
    names = {c["name"] for c in await redis.xinfo_consumers(stream, queue.group)}
    assert removed == 1
    assert names == {"has-pending"}
