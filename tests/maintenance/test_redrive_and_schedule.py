"""The scheduler and the policy sweep against a real redis-server, in process: a missed
schedule is caught up once, a redrive budget stops a poison job, the global rate limit holds
across replicas, and every action is in the subject's audit trail."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from redis.asyncio import Redis

from splatq.services.dlq_redriver.service import build_scheduler, task_store
from splatq.shared.engine.queue import JobQueue
from splatq.shared.maintenance.bucket import RedriveBucket
from splatq.shared.maintenance.keys import MaintenanceKeys
from splatq.shared.maintenance.schedule import Schedule
from splatq.shared.maintenance.scheduler import Scheduler, TaskRun
from splatq.shared.maintenance.store import Refusal, Trigger
from tests.maintenance.helpers import (
    audit_actions,
    audit_times_ms,
    config_at,
    dead_letter_jobs,
    write_config,
)

HOUR_MS = 3600_000


class Counting:
    """A task that counts its runs (hourly: its slot does not move during the test)."""

    name = "counting"
    schedule = Schedule("0 * * * *")

    def __init__(self) -> None:
        self.runs = 0

    async def run(self, run: TaskRun) -> str:
        self.runs += 1
        await run.save("done")
        return "counted"


async def test_three_missed_intervals_are_caught_up_by_one_run(queue: JobQueue) -> None:
    task = Counting()
    store = task_store(queue)
    now = time.time()
    latest_ms = int(task.schedule.latest_slot(now) * 1000)
    keys = MaintenanceKeys(queue.keys)
    # The last run covered the slot three intervals before the latest: three were missed.
    await queue.redis.hset(keys.task_state(task.name), "last_slot_ms", latest_ms - 3 * HOUR_MS)
    replicas = [Scheduler(store, [task], f"r{i}", 2000, 0.05) for i in range(2)]
    for _ in range(5):  # both replicas, several polls within the same slot
        await asyncio.gather(*(r.tick() for r in replicas))
        await asyncio.sleep(0.02)
    await asyncio.gather(*(t for r in replicas for t in list(r._running.values())))
    assert task.runs == 1
    history = await store.history(task.name)
    assert [h["slot_ms"] for h in history] == [str(latest_ms)]
    assert (await store.state(task.name)).last_slot_ms == latest_ms
    again = await store.claim(task.name, "r9", 2000, latest_ms, Trigger.SCHEDULE)
    assert isinstance(again, Refusal)
    assert again.why == "done"


async def test_a_redrive_budget_stops_a_poison_job(
    queue: JobQueue, redis: Redis, tmp_path: Path
) -> None:
    config = config_at(write_config(tmp_path / "p.toml", budget=2))
    scheduler = build_scheduler(queue, queue.settings, config, holder="test")
    [job_id] = await dead_letter_jobs(queue, redis)
    for _ in range(2):  # redriven, then it kills its worker again
        result = await scheduler.run_now("redrive_sweep")
        assert not isinstance(result, Refusal)
        assert "redriven 1" in result.summary
        job = await queue.get(job_id)
        assert job is not None
        assert job.status == "queued"
        await dead_letter_jobs(queue, redis, [job_id])
    for _ in range(2):  # budget spent: held, and recorded once however often it is swept
        await scheduler.run_now("redrive_sweep")
    job = await queue.get(job_id)
    assert job is not None
    assert job.status == "failed"
    assert await redis.xlen(queue.keys.dead_letters(0)) == 1
    assert await audit_actions(redis, queue, job_id) == ["redriven", "redriven", "exhausted"]
    assert await redis.hget(queue.keys.job(job_id), "redrives") == "2"


async def test_the_global_rate_limit_holds(queue: JobQueue, redis: Redis, tmp_path: Path) -> None:
    rate, burst = 40.0, 4
    config = config_at(write_config(tmp_path / "p.toml", rate=rate, burst=burst, batch=10))
    job_ids = await dead_letter_jobs(queue, redis, count=20)
    scheduler = build_scheduler(queue, queue.settings, config, holder="test")
    # A second replica's redrives (manual ones, say) draw on the same bucket meanwhile.
    other = RedriveBucket(queue.scripts, MaintenanceKeys(queue.keys).redrive_bucket(), rate, burst)
    taken_by_other = 0
    started = time.monotonic()
    sweep = asyncio.create_task(scheduler.run_now("redrive_sweep"))
    while not sweep.done():
        taken_by_other += await other.take(1)
    elapsed = time.monotonic() - started
    assert await redis.xlen(queue.keys.dead_letters(0)) == 0
    times = await audit_times_ms(redis, queue, job_ids)
    assert len(times) == 20
    total = len(times) + taken_by_other
    assert total <= burst + rate * elapsed + 1, (total, elapsed)
    for i, first in enumerate(times):  # and in every window of the sweep
        in_window = [t for t in times[i:] if t - first <= 1000]
        assert len(in_window) <= burst + rate * 1.0 + 1
