"""One process is one fleet member (shared/engine/fleet.py): the stage workers of a staged
process take one name, tick the fleet clock once, and count their jobs together for crash
attribution. Real Redis, in-process stage workers (one `start_stages` call is one process)."""

from __future__ import annotations

from redis.asyncio import Redis

from splatq.shared.engine.fleet import FleetMember
from splatq.shared.engine.jobs import JobSpec
from splatq.shared.engine.queue import JobQueue
from splatq.shared.storage.store import LocalFileStorage
from splatq.shared.testing import StagesFactory, eventually
from tests.stage_handlers import ToyStages


async def _ticked(redis: Redis, queue: JobQueue) -> dict[str, float]:
    return dict(await redis.zrange(queue.keys.workers(0), 0, -1, withscores=True))


async def test_the_stage_workers_of_a_process_tick_the_fleet_as_one_member(
    queue: JobQueue, redis: Redis, storage: LocalFileStorage, start_stages: StagesFactory
) -> None:
    """Every stage worker of the process (and its cleanup consumer) runs under the process's
    one name, and only that name is in the fleet's record of who is alive: the death of the
    process is the death of one member, not of five."""
    workers = await start_stages(ToyStages(storage), "all")
    names = {w.consumer for w in workers}
    assert len(names) == 1
    [name] = names

    async def ticked() -> bool:
        return name in await _ticked(redis, queue)

    await eventually(ticked)
    first = (await _ticked(redis, queue))[name]

    async def ticked_again() -> bool:
        return (await _ticked(redis, queue))[name] > first

    await eventually(ticked_again)  # several ticks of its clock, one name
    assert list(await _ticked(redis, queue)) == [name]


async def test_a_process_counts_its_jobs_in_every_stage_as_sharing_it(
    queue: JobQueue, redis: Redis, storage: LocalFileStorage, start_stages: StagesFactory
) -> None:
    """Two jobs in two stages of one process: each record says two jobs share its process
    (`co_running`, the k of a death's 1/k charge), whichever stage worker runs it."""
    slow = [
        (await queue.enqueue(JobSpec(tenant=t, quality="preview", metadata=m))).job_id
        for t, m in (("acme", {"slow": {"ingest": 30}}), ("globex", {"slow": {"render": 30}}))
    ]
    await start_stages(ToyStages(storage), "all")

    async def shared() -> bool:
        jobs = [await queue.get(j) for j in slow]
        stages = [j.current_stage if j is not None else "" for j in jobs]
        counts = [await redis.hget(queue.keys.job(j), "co_running") for j in slow]
        return stages == ["ingest", "render"] and counts == ["2", "2"]

    await eventually(shared)


async def test_the_clock_runs_while_any_worker_of_the_process_runs(
    queue: JobQueue, redis: Redis
) -> None:
    """The first worker to join starts the process's clock, the last to leave stops it: a
    process draining its last stage still ticks."""
    member = FleetMember()
    member.join(queue, [0], 0.02)
    member.join(queue, [0], 0.02)
    assert member.ticking

    async def ticked() -> bool:
        return member.name in await _ticked(redis, queue)

    await eventually(ticked)
    await member.leave()
    assert member.ticking
    before = (await _ticked(redis, queue))[member.name]

    async def ticked_again() -> bool:
        return (await _ticked(redis, queue))[member.name] > before

    await eventually(ticked_again)
    await member.leave()
    assert not member.ticking
    member.count(lambda: 2)
    member.count(lambda: 1)
    assert member.running() == 3
