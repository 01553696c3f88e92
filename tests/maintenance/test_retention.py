"""Retention against real Redis and local storage: old objects nobody needs go; an input a
live (or redrivable) job names never does, including while identical submissions race the
task; artifact ages follow the tenant."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

from redis.asyncio import Redis

from splatq.shared.engine.jobs import JobSpec
from splatq.shared.engine.keys import StreamName
from splatq.shared.engine.queue import JobQueue
from splatq.shared.maintenance.config import RetentionConfig
from splatq.shared.storage.store import LocalFileStorage, ObjectInfo, input_key
from tests.maintenance.helpers import retention_scheduler, run_task

DAY = 86_400.0


def _age(storage: LocalFileStorage, key: str, seconds: float) -> None:
    at = time.time() - seconds
    os.utime(storage.path_of(key), (at, at))


async def _put(storage: LocalFileStorage, key: str, age_s: float = 0.0) -> str:
    await storage.put_bytes(key, b"x" * 16)
    if age_s:
        _age(storage, key, age_s)
    return key


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
    # staged intermediates: a failed job keeps its own until the artifact age (a redrive
    # resumes from them); a running job keeps them; an expired job's go
    mid_failed = await _put(storage, f"intermediates/{failed.job_id}/ingest/ab/image.pt", 2 * DAY)
    mid_running = await _put(storage, f"intermediates/{running.job_id}/ingest/ab/x", 40 * DAY)
    mid_gone = await _put(storage, "intermediates/job_000NOTAJOBANYMORE0000000000/e/ab/x", 31 * DAY)

    summary = await run_task(retention_scheduler(queue, storage, config))
    assert summary == "deleted 2 inputs, 2 artifacts, 1 intermediates"
    kept = {queued_in, failed_in, fresh_in, art_running, art_recent, mid_failed, mid_running}
    gone = {done_in, orphan_in, art_done, art_gone, mid_gone}
    assert {k for k in kept | gone if await storage.exists(k)} == kept


async def test_identical_submissions_racing_retention_keep_their_input(
    queue: JobQueue, tmp_path: Path
) -> None:
    storage = LocalFileStorage(tmp_path / "objects", group_commit=False)
    config = RetentionConfig(inputs_max_age_s=1, inputs_grace_s=0)
    scheduler = retention_scheduler(queue, storage, config)
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
            await run_task(scheduler)
            runs += 1
        return runs

    submissions = asyncio.gather(*(submit(i) for i in range(40)))  # over 2 s: past the age
    runs = await sweep_until(submissions)
    await submissions
    assert runs >= 3
    assert len(job_ids) == 1  # identical submissions share one job ...
    assert await storage.exists(key)  # ... and its input outlived every sweep
    _age(storage, key, 10)
    await run_task(scheduler)
    assert await storage.exists(key)  # old, but the queued job needs it


async def test_an_input_younger_than_the_grace_is_never_deleted(
    queue: JobQueue, tmp_path: Path
) -> None:
    """A submission stores its input before it records its job: an input nobody names yet is
    kept while younger than inputs_grace_s, whatever inputs_max_age_s says."""
    storage = LocalFileStorage(tmp_path / "objects", group_commit=False)
    config = RetentionConfig(inputs_max_age_s=0, inputs_grace_s=600)
    in_flight = await _put(storage, input_key("a" * 64, "png"), 590)
    stale = await _put(storage, input_key("b" * 64, "png"), 610)
    assert await run_task(retention_scheduler(queue, storage, config)) == (
        "deleted 1 inputs, 0 artifacts, 0 intermediates"
    )
    assert await storage.exists(in_flight)
    assert not await storage.exists(stale)


class ResubmittedWhileListed(LocalFileStorage):
    """A submission stores `key` again (put_if_absent: it exists) right after retention
    listed it as old and before retention decides on it."""

    def __init__(self, root: Path, key: str) -> None:
        super().__init__(root, group_commit=False)
        self.key = key
        self.stored_again = False

    async def list_objects(self, prefix: str, after: str = "") -> AsyncIterator[ObjectInfo]:
        async for obj in super().list_objects(prefix, after):
            yield obj
        if prefix == "inputs":
            assert not await self.put_if_absent(self.key, b"x" * 16)
            self.stored_again = True


async def test_an_old_input_stored_again_after_the_listing_is_kept(
    queue: JobQueue, tmp_path: Path
) -> None:
    """Storing an input that exists refreshes its age, and retention reads an input's age
    again just before deleting it: an old input a new submission stores (and is about to
    name in its job) survives the run that listed it as old."""
    key = input_key("c" * 64, "png")
    storage = ResubmittedWhileListed(tmp_path / "objects", key)
    await _put(storage, key, 9 * DAY)
    config = RetentionConfig(inputs_max_age_s=int(DAY))
    summary = await run_task(retention_scheduler(queue, storage, config))
    assert storage.stored_again
    assert summary == "deleted 0 inputs, 0 artifacts, 0 intermediates"
    assert await storage.exists(key)
    assert time.time() - os.stat(storage.path_of(key)).st_mtime < 60
