"""Retention against real Redis and local storage: old objects nobody needs go; an input a
live (or redrivable) job names never does, including while identical submissions race the
task; artifact ages follow the tenant."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from pathlib import Path

from redis.asyncio import Redis

from splatq.services.dlq_redriver.service import task_store
from splatq.shared.engine.jobs import JobSpec
from splatq.shared.engine.keys import StreamName
from splatq.shared.engine.queue import JobQueue
from splatq.shared.maintenance.config import RetentionConfig
from splatq.shared.maintenance.retention import Retention
from splatq.shared.maintenance.schedule import Schedule
from splatq.shared.maintenance.scheduler import Scheduler
from splatq.shared.maintenance.store import Refusal
from splatq.shared.storage.store import LocalFileStorage, input_key

DAY = 86_400.0


def _age(storage: LocalFileStorage, key: str, seconds: float) -> None:
    at = time.time() - seconds
    os.utime(storage.path_of(key), (at, at))


async def _put(storage: LocalFileStorage, key: str, age_s: float = 0.0) -> str:
    await storage.put_bytes(key, b"x" * 16)
    if age_s:
        _age(storage, key, age_s)
    return key


def _scheduler(queue: JobQueue, storage: LocalFileStorage, config: RetentionConfig) -> Scheduler:
    task = Retention(queue, storage, config, Schedule("0 4 * * *"), batch=3)
    return Scheduler(task_store(queue), [task], "test", 5000, 0.05)


async def _run(scheduler: Scheduler) -> str:
    result = await scheduler.run_now("retention")
    assert not isinstance(result, Refusal)
    assert result.outcome.value == "success", result.summary
    return result.summary


async def test_only_objects_no_job_needs_are_deleted(
    queue: JobQueue, redis: Redis, tmp_path: Path
) -> None:
    storage = LocalFileStorage(tmp_path / "objects", group_commit=False)
    config = RetentionConfig(inputs_max_age_s=7 * 86_400, artifacts_max_age_s=30 * 86_400,
                             tenant_artifacts_max_age_s={"brief": 86_400})  # fmt: skip
    queued_in = await _put(storage, input_key("a" * 64, "png"), 9 * DAY)
    failed_in = await _put(storage, input_key("b" * 64, "png"), 9 * DAY)
    done_in = await _put(storage, input_key("c" * 64, "png"), 9 * DAY)
    orphan_in = await _put(storage, input_key("d" * 64, "png"), 9 * DAY)
    fresh_in = await _put(storage, input_key("e" * 64, "png"))
    queued = await queue.enqueue(JobSpec(tenant="acme", quality="preview", input_ref=queued_in))
    failed = await queue.enqueue(JobSpec(tenant="acme", quality="preview", input_ref=failed_in))
    done = await queue.enqueue(JobSpec(tenant="brief", quality="preview", input_ref=done_in))
    await redis.hset(queue.keys.job(failed.job_id), "status", "failed")
    await redis.hset(queue.keys.job(done.job_id), "status", "completed")
    running = await queue.enqueue(JobSpec(tenant="brief", quality="preview"))
    await queue.take(0, {StreamName.INTERACTIVE: 4}, 4, "w")  # running: processing
    await redis.hset(queue.keys.job(queued.job_id), "status", "queued")
    art_done = await _put(storage, f"jobs/{done.job_id}/a1/scene.ply", 2 * DAY)
    art_running = await _put(storage, f"jobs/{running.job_id}/a1/scene.ply", 40 * DAY)
    art_gone = await _put(storage, "jobs/job_000NOTAJOBANYMORE0000000000/scene.ply", 31 * DAY)
    art_recent = await _put(storage, "jobs/job_000NOTAJOBANYMORE0000000001/scene.ply", 2 * DAY)

    summary = await _run(_scheduler(queue, storage, config))
    assert summary == "deleted 2 inputs, 2 artifacts"
    kept = {queued_in, failed_in, fresh_in, art_running, art_recent}
    gone = {done_in, orphan_in, art_done, art_gone}
    assert {k for k in kept | gone if await storage.exists(k)} == kept


async def test_identical_submissions_racing_retention_keep_their_input(
    queue: JobQueue, tmp_path: Path
) -> None:
    storage = LocalFileStorage(tmp_path / "objects", group_commit=False)
    config = RetentionConfig(inputs_max_age_s=1)
    scheduler = _scheduler(queue, storage, config)
    key = input_key("f" * 64, "png")
    base = JobSpec(tenant="acme", quality="preview", input_ref=key, idempotency_key="same")
    job_ids: set[str] = set()

    async def submit(i: int) -> None:
        await asyncio.sleep(i * 0.05)  # as the gateway does: store the input, then enqueue
        await storage.put_if_absent(key, b"image")
        result = await queue.enqueue(dataclasses.replace(base, metadata={"n": str(i)}))
        job_ids.add(result.job_id)

    async def sweep_until(done: asyncio.Future[list[None]]) -> int:
        runs = 0
        while not done.done() or runs < 3:
            await _run(scheduler)
            runs += 1
        return runs

    submissions = asyncio.gather(*(submit(i) for i in range(40)))  # over 2 s: past the age
    runs = await sweep_until(submissions)
    await submissions
    assert runs >= 3
    assert len(job_ids) == 1  # identical submissions share one job ...
    assert await storage.exists(key)  # ... and its input outlived every sweep
    _age(storage, key, 10)
    await _run(scheduler)
    assert await storage.exists(key)  # old, but the queued job needs it
