"""The 3DGS job through the staged pipeline on CPU: real Redis, one worker per stage, the
builtin model, local storage. The staged result is the whole-job result, stage by stage."""

from __future__ import annotations

from typing import Any

import orjson
from redis.asyncio import Redis

from splatq.services.gpu_worker.stages import StageHandlers
from splatq.shared.engine.ids import partition_of
from splatq.shared.engine.metering import UNIT_DIGEST_CHARS, stage_unit
from splatq.shared.engine.queue import JobQueue
from splatq.shared.engine.stages import PIPELINE, PipelineStage, StageStatus
from splatq.shared.settings import Settings
from splatq.shared.storage.store import ARTIFACT_FILES, LocalFileStorage, artifact_key
from splatq.shared.testing import StagesFactory, WorkerFactory, eventually, wait_for_status
from tests.gpu_worker.conftest import sample_png, stored_spec


async def _artifacts(storage: LocalFileStorage, queue: JobQueue, job_id: str) -> dict[str, bytes]:
    job = await queue.get(job_id)
    assert job is not None
    assert job.artifact_run
    return {
        n: await storage.get_bytes(artifact_key(job_id, f, job.artifact_run))
        for n, f in ARTIFACT_FILES.items()
    }


async def test_a_staged_job_passes_every_stage_and_equals_the_whole_job_result(
    queue: JobQueue,
    redis: Redis,
    settings: Settings,
    storage: LocalFileStorage,
    stage_handlers: StageHandlers,
    start_stages: StagesFactory,
    start_worker: WorkerFactory,
    gpu_handler_factory: Any,
) -> None:
    data = sample_png(3)
    staged = await queue.enqueue(await stored_spec(storage, data))
    await start_stages(stage_handlers, "all")
    job = await wait_for_status(queue, staged.job_id, {"completed", "failed"}, timeout=60)
    assert job.status.value == "completed", job.error
    assert job.current_stage == "publish"
    for stage in PIPELINE[:-1]:
        record = job.ledger[stage]
        assert record.status is StageStatus.SUCCEEDED
        assert record.attempts == 1
        assert not record.skipped
        assert record.digest
    assert all(stage_handlers.store.work_done[s] == 1 for s in PIPELINE)
    staged_files = await _artifacts(storage, queue, staged.job_id)

    # cleanup deletes the intermediates and records itself in the ledger
    async def cleaned() -> bool:
        j = await queue.get(staged.job_id)
        return j is not None and PipelineStage.CLEANUP in j.ledger

    await eventually(cleaned, timeout=10)
    assert not list(storage.path_of(f"intermediates/{staged.job_id}").rglob("*.pt"))

    # the same input as a whole job (a monolithic worker) gives the same bytes
    whole = await queue.enqueue(await stored_spec(storage, data))
    await start_worker(await gpu_handler_factory(settings))
    await wait_for_status(queue, whole.job_id, {"completed"}, timeout=60)
    assert await _artifacts(storage, queue, whole.job_id) == staged_files

    # stage progress went out through the outbox, in order
    entries = await redis.xrange(queue.keys.events(partition_of(staged.job_id)))
    progress = [(f["type"], f["payload"]) for _, f in entries if f.get("job_id") == staged.job_id]
    names = [t.rsplit(".", 1)[1] for t, _ in progress]
    assert names[0] == "queued"
    assert names[1] == "started"
    assert names[-1] == "completed"
    assert sum('"stage_status":"succeeded"' in p for _, p in progress) == 4
    assert sum('"stage_status":"running"' in p for _, p in progress) == 4

    # The job's history rebuilds those very payloads from compact items: the members every
    # progress event repeats, and the job's artifact path, are one-character tokens there.
    history = await queue.job_history(staged.job_id)
    assert [(kind, payload) for _, kind, payload in history] == progress
    items = await redis.lrange(queue.keys.job_history(staged.job_id), 0, -1)
    assert not any("stage_status" in item for item in items)
    assert not any(f"/v1/jobs/{staged.job_id}/" in item for item in items)
    assert sum(len(i) for i in items) < sum(len(p) for _, p in progress) // 2

    # The record keeps the artifacts' base once and their names; read back, they are the
    # URLs the completed event named.
    raw = await redis.hgetall(queue.keys.job(staged.job_id))
    completed = orjson.loads(progress[-1][1])["data"]["artifacts"]
    assert raw["artifact_names"] == ",".join(completed)
    assert raw["artifacts"] == ""
    assert dict(job.artifacts or {}) == completed

    # After cleanup each stage's ledger record keeps of its digest what names its metered
    # unit: the tie to what the stage was billed for holds.
    cleaned_job = await queue.get(staged.job_id)
    assert cleaned_job is not None
    for stage in PIPELINE[:-1]:
        record = cleaned_job.ledger[stage]
        assert not record.outputs
        assert len(record.digest) == UNIT_DIGEST_CHARS
        assert record.digest == job.ledger[stage].digest[:UNIT_DIGEST_CHARS]
        assert stage_unit(stage.value, record.digest) in cleaned_job.metered


async def test_a_job_exported_before_spz_existed_publishes_without_it(
    queue: JobQueue,
    redis: Redis,
    storage: LocalFileStorage,
    stage_handlers: StageHandlers,
    start_stages: StagesFactory,
) -> None:
    """A rolling upgrade: a job whose export ran on a worker without .spz (its ledger record
    names no `spz` output) is published by a new worker with the artifacts it has."""
    job_id = (await queue.enqueue(await stored_spec(storage, sample_png(4)))).job_id
    await start_stages(stage_handlers, "ingest,reconstruct,export,render")

    async def at_publish() -> bool:
        job = await queue.get(job_id)
        return job is not None and PipelineStage.RENDER in job.ledger

    await eventually(at_publish, timeout=60)
    field = f"ps.{PipelineStage.EXPORT.value}"
    record = orjson.loads(await redis.hget(queue.keys.job(job_id), field))
    del record["outputs"]["spz"]  # as the previous export version recorded it
    await redis.hset(queue.keys.job(job_id), field, orjson.dumps(record).decode())
    await start_stages(stage_handlers, "publish")
    job = await wait_for_status(queue, job_id, {"completed", "failed"}, timeout=60)
    assert job.status.value == "completed", job.error
    assert set(job.artifacts or {}) == {"gaussian_ply", "splat", "rendered_preview", "mask"}
