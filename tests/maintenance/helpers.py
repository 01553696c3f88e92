"""Dead letters made the way production makes them (a worker death charged to its limit,
found by the reaper), and a redriver's parts bound to a test's Redis."""

from __future__ import annotations

from pathlib import Path

from redis.asyncio import Redis

from splatq.services.dlq_redriver.service import task_store
from splatq.shared.engine.keys import StreamName
from splatq.shared.engine.queue import JobQueue
from splatq.shared.engine.reaper import Reaper
from splatq.shared.maintenance.config import RedriverConfig, RetentionConfig, load_config
from splatq.shared.maintenance.keys import DeadLetterKind, MaintenanceKeys
from splatq.shared.maintenance.retention import Retention
from splatq.shared.maintenance.schedule import Schedule
from splatq.shared.maintenance.scheduler import Scheduler, Task
from splatq.shared.maintenance.store import Refusal
from splatq.shared.storage.store import Storage
from splatq.shared.testing import eventually
from tests.helpers import spec

POISON_POLICY = """
[rate_limit]
per_s = {rate}
burst = {burst}

[sweep]
batch = {batch}

[[policies]]
name = "poison-retry"
kind = "jobs"
codes = ["max_deliveries_exceeded"]
action = "redrive"
budget = {budget}

[tasks.redrive_sweep]
schedule = "{schedule}"
"""
OTHER_TASKS = ("retention", "expire_records", "prune_consumers", "stream_bounds", "expired_leases")


def write_config(
    path: Path,
    *,
    rate: float = 1000,
    burst: int = 1000,
    batch: int = 100,
    budget: int = 3,
    schedule: str = "0 0 * * *",
    others: bool = False,
) -> Path:
    text = POISON_POLICY.format(
        rate=rate, burst=burst, batch=batch, budget=budget, schedule=schedule
    )
    for name in OTHER_TASKS:
        text += f"\n[tasks.{name}]\nenabled = {'true' if others else 'false'}\n"
    path.write_text(text)
    return path


def config_at(path: Path) -> RedriverConfig:
    return load_config(str(path))


async def dead_letter_jobs(queue: JobQueue, redis: Redis, job_ids: list[str] | None = None,
                           count: int = 1) -> list[str]:  # fmt: skip
    """Enqueue `count` jobs (or re-deliver the queued `job_ids`), start them on a worker that
    then dies with its last allowed charge: the reaper dead-letters every one."""
    if job_ids is None:
        job_ids = [(await queue.enqueue(spec(order=f"P-{i}"))).job_id for i in range(count)]
    await queue.fleet_tick([0])  # a live fleet: the lapse is a death, not an outage
    taken = await queue.take(0, {StreamName.INTERACTIVE: len(job_ids)}, len(job_ids), "doomed")
    assert sorted(t.job.id for t in taken if t.job) == sorted(job_ids), taken
    pipe = redis.pipeline(transaction=False)
    for job_id in job_ids:
        pipe.delete(queue.keys.lease(job_id))
        pipe.hset(queue.keys.job(job_id), "delivery_charge", str(queue.settings.max_deliveries))
    await pipe.execute()
    reaper = Reaper(queue, "reaper", 0.0)

    async def all_dead() -> bool:
        await queue.fleet_tick([0])  # other workers stay alive and tick the fleet clock
        await reaper.reap_stale_entries(0, StreamName.INTERACTIVE, len(job_ids))
        jobs = [await queue.get(j) for j in job_ids]
        return all(j is not None and j.status == "failed" for j in jobs)

    await eventually(all_dead, timeout=15, interval=0.1)
    return job_ids


async def audit_actions(redis: Redis, queue: JobQueue, job_id: str) -> list[str]:
    keys = MaintenanceKeys(queue.keys)
    trail = await redis.xrange(keys.audit(DeadLetterKind.JOBS, 0, job_id, ""))
    return [f["action"] for _, f in trail]


async def audit_times_ms(redis: Redis, queue: JobQueue, job_ids: list[str]) -> list[int]:
    keys = MaintenanceKeys(queue.keys)
    times = []
    for job_id in job_ids:
        for _, f in await redis.xrange(keys.audit(DeadLetterKind.JOBS, 0, job_id, "")):
            if f["action"] == "redriven":
                times.append(int(f["at_ms"]))
    return sorted(times)


def scheduler_of(queue: JobQueue, task: Task) -> Scheduler:
    """A scheduler holding only `task`."""
    return Scheduler(task_store(queue), [task], "test", 5000, 0.05)


def retention_scheduler(queue: JobQueue, storage: Storage, config: RetentionConfig) -> Scheduler:
    """A scheduler holding only the retention task (batches of 3: several checkpoints)."""
    return scheduler_of(queue, Retention(queue, storage, config, Schedule("0 4 * * *"), batch=3))


async def run_task(scheduler: Scheduler, name: str = "retention") -> str:
    """Run a task now; it must succeed; its summary."""
    result = await scheduler.run_now(name)
    assert not isinstance(result, Refusal)
    assert result.outcome.value == "success", result.summary
    return result.summary
