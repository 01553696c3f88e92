"""The GPU worker end to end on CPU: real Redis, the engine's worker runtime, the builtin
model, local storage, batching, OOM splitting, cancel and artifact commits."""

from __future__ import annotations

import threading
from typing import Any

import torch
from redis.asyncio import Redis

from splatq.services.gpu_worker import formats
from splatq.services.gpu_worker.artifacts import commit_all, encode_artifacts, stage_and_verify
from splatq.services.gpu_worker.images import decode_image
from splatq.services.gpu_worker.model import load_model
from splatq.shared.engine.jobs import JobRecord
from splatq.shared.engine.queue import JobQueue
from splatq.shared.settings import Settings
from splatq.shared.storage.store import ARTIFACT_FILES, LocalFileStorage, artifact_key, artifact_run
from splatq.shared.testing import WorkerFactory, eventually, job_events, wait_for_status
from tests.gpu_worker.conftest import opaque_noise_png, sample_png, stored_spec


async def _artifacts(storage: LocalFileStorage, job: JobRecord) -> dict[str, bytes]:
    assert job.artifact_run  # the run folder the fenced commit recorded
    return {
        n: await storage.get_bytes(artifact_key(job.id, f, job.artifact_run))
        for n, f in ARTIFACT_FILES.items()
    }


def _files_under_job(storage: LocalFileStorage, job_id: str) -> list[str]:
    job_dir = storage.path_of(f"jobs/{job_id}")
    return [str(p) for p in job_dir.rglob("*") if p.is_file()] if job_dir.exists() else []


async def test_jobs_submitted_together_share_forward_passes_without_cross_talk(
    queue: JobQueue,
    redis: Redis,
    settings: Settings,
    storage: LocalFileStorage,
    start_worker: WorkerFactory,
    gpu_handler_factory: Any,
) -> None:
    """Four different images in one batch: fewer forward passes than jobs, and each job's
    artifacts are its own (Gaussian count equals a solo run of the model on that image)."""
    s = settings.with_overrides(batch_max_size=4, batch_max_wait_ms=300, worker_concurrency=8)
    handler = await gpu_handler_factory(s)
    inputs = [sample_png(seed) for seed in range(4)]
    jobs = [await queue.enqueue(await stored_spec(storage, data)) for data in inputs]
    await start_worker(handler, batch_max_size=4, worker_concurrency=8)
    solo = load_model("builtin")
    solo.load(torch.device("cpu"))
    previews = set()
    for data, submitted in zip(inputs, jobs, strict=True):
        job = await wait_for_status(queue, submitted.job_id, {"completed"}, timeout=60)
        files = await _artifacts(storage, job)
        [expected] = solo.infer(handler.prepare(data, (128,)).images[128].unsqueeze(0))
        info = formats.verify_ply(files["gaussian_ply"], expected_count=expected.count)
        assert info.count == expected.count > 0
        assert formats.verify_splat(files["splat"]) == expected.count
        assert formats.verify_png(files["rendered_preview"]) == (128, 128)
        assert job.artifacts is not None
        assert set(job.artifacts) == {"gaussian_ply", "splat", "spz", "rendered_preview", "mask"}
        assert job.foreground == "alpha"  # the samples are cut-outs
        assert job.artifacts["splat"].endswith(f"/v1/jobs/{job.id}/artifacts/splat")
        assert job.model == solo.version
        previews.add(files["rendered_preview"])
        assert (await job_events(redis, queue, job.id))[-1] == "3d_reconstruction.completed"
    assert len(previews) == 4
    assert handler.forward_passes < 4


async def test_a_job_too_big_for_the_device_fails_alone_and_its_batch_mates_complete(
    queue: JobQueue,
    redis: Redis,
    settings: Settings,
    storage: LocalFileStorage,
    start_worker: WorkerFactory,
    gpu_handler_factory: Any,
) -> None:
    """Device OOM (simulated budget, real OutOfMemoryError type): the batch is split; the job
    that does not fit alone fails non-retryable with CUDA_OUT_OF_MEMORY; the others complete.
    (No stage 0: the noise image is all foreground by the model's own rule.)"""
    small = [sample_png(seed) for seed in range(3)]
    big = opaque_noise_png()
    fg = [int((decode_image(d, 128)[3] > 0.5).sum()) for d in [*small, big]]
    assert 2 * max(fg[:3]) < fg[3]
    s = settings.with_overrides(
        batch_max_size=4,
        batch_max_wait_ms=300,
        worker_concurrency=8,
        device_memory_budget_pixels=fg[3] - 1,
        foreground="none",
    )
    handler = await gpu_handler_factory(s)
    small_jobs = [await queue.enqueue(await stored_spec(storage, d)) for d in small]
    big_job = await queue.enqueue(await stored_spec(storage, big))
    await start_worker(handler, batch_max_size=4, worker_concurrency=8)
    failed = await wait_for_status(queue, big_job.job_id, {"failed", "completed"}, timeout=60)
    assert failed.status == "failed"
    assert failed.error is not None
    assert (failed.error.code, failed.error.retryable) == ("CUDA_OUT_OF_MEMORY", False)
    assert failed.attempts == 1
    assert (await job_events(redis, queue, failed.id))[-1] == "3d_reconstruction.failed"
    for j in small_jobs:
        assert (await wait_for_status(queue, j.job_id, {"completed"}, timeout=60)).artifacts
    assert _files_under_job(storage, failed.id) == []


async def test_corrupt_input_fails_permanently_with_invalid_image(
    queue: JobQueue,
    settings: Settings,
    storage: LocalFileStorage,
    start_worker: WorkerFactory,
    gpu_handler_factory: Any,
) -> None:
    """Truncated PNG bytes: failed once, INVALID_IMAGE, not retried."""
    handler = await gpu_handler_factory(settings)
    job = await queue.enqueue(await stored_spec(storage, sample_png(0)[:200]))
    await start_worker(handler)
    failed = await wait_for_status(queue, job.job_id, {"failed"}, timeout=30)
    assert failed.error is not None
    assert (failed.error.code, failed.error.retryable, failed.attempts) == (
        "INVALID_IMAGE", False, 1,
    )  # fmt: skip


async def test_cancel_during_inference_commits_no_artifacts(
    queue: JobQueue,
    redis: Redis,
    settings: Settings,
    storage: LocalFileStorage,
    start_worker: WorkerFactory,
    gpu_handler_factory: Any,
) -> None:
    """A job canceled while its forward pass runs stops at the next stage boundary: status
    canceled, no artifact at any final key, no temporary file left."""
    handler = await gpu_handler_factory(settings)
    gate = threading.Event()
    real_infer = handler.model.infer

    def held_infer(images: torch.Tensor) -> Any:
        gate.wait(timeout=30)
        return real_infer(images)

    handler.model.infer = held_infer  # type: ignore[method-assign]
    job = await queue.enqueue(await stored_spec(storage, sample_png(0)))
    await start_worker(handler)

    async def in_inference() -> bool:
        j = await queue.get(job.job_id)
        return j is not None and j.stage == "inference"

    await eventually(in_inference, timeout=30)
    assert await queue.cancel(job.job_id) == "cancel_requested"
    await eventually(lambda: _flag_seen(redis, queue, job.job_id), timeout=10)
    gate.set()
    done = await wait_for_status(queue, job.job_id, {"canceled"}, timeout=30)
    assert done.artifacts is None
    assert _files_under_job(storage, job.job_id) == []


async def _flag_seen(redis: Redis, queue: JobQueue, job_id: str) -> bool:
    return bool(await redis.hget(queue.keys.job(job_id), "cancel_requested"))


async def test_a_stale_run_committing_late_cannot_replace_the_jobs_artifacts(
    queue: JobQueue,
    settings: Settings,
    storage: LocalFileStorage,
    start_worker: WorkerFactory,
    gpu_handler_factory: Any,
) -> None:
    """Each run writes its own folder and only the lease-fenced commit names the job's: a
    run that lost its job and commits its files afterwards (other, valid artifacts) leaves
    the job's recorded artifacts byte for byte as the winning run wrote them."""
    job = await queue.enqueue(await stored_spec(storage, sample_png(1)))
    await start_worker(await gpu_handler_factory(settings))
    done = await wait_for_status(queue, job.job_id, {"completed"}, timeout=60)
    assert done.artifact_run == artifact_run(1)
    before = await _artifacts(storage, done)

    model = load_model("builtin")
    model.load(torch.device("cpu"))
    [other] = model.infer(decode_image(sample_png(7), 128).unsqueeze(0))
    stale = encode_artifacts(other, model.input_camera(128))
    assert stale.files["gaussian_ply"] != before["gaussian_ply"]
    # The loser of a takeover: its Redis check passed just before it lost the job, so it
    # commits its files anyway -- into its own run's folder.
    staged = await stage_and_verify(storage, job.job_id, stale, artifact_run(2))
    await commit_all(storage, staged)

    after = await queue.get(job.job_id)
    assert after is not None
    assert after.artifact_run == artifact_run(1)
    assert await _artifacts(storage, after) == before
