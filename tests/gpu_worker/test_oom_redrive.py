"""CUDA out of memory end to end, on CPU (the simulated device budget raises the real
torch.cuda.OutOfMemoryError): a job that does not fit even alone is failed *and* dead-lettered
as CUDA_OUT_OF_MEMORY in the same commit; the redriver's policy redrives it with
`hint_batch_max_size = 1`; the worker honours the hint -- the job runs in a batch of its own
although neighbours arrive with it -- and it completes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from redis.asyncio import Redis

from splatq.services.dlq_redriver.service import build_scheduler
from splatq.services.gpu_worker.device_scheduler import Priority
from splatq.services.gpu_worker.handler import GpuJobHandler, _Item
from splatq.services.gpu_worker.images import decode_image
from splatq.services.gpu_worker.metrics import GpuMetrics
from splatq.services.gpu_worker.model import load_model
from splatq.services.gpu_worker.oom import MemoryBudget
from splatq.shared.engine.ids import partition_of
from splatq.shared.engine.queue import JobQueue
from splatq.shared.engine.worker import Worker
from splatq.shared.maintenance.scheduler import RunResult
from splatq.shared.settings import Settings
from splatq.shared.storage.store import LocalFileStorage
from splatq.shared.testing import finish_or_cancel, job_events, wait_for_status
from tests.gpu_worker.conftest import opaque_noise_png, sample_png, stored_spec
from tests.maintenance.helpers import OTHER_TASKS, audit_actions, config_at

OOM_POLICY = """
[rate_limit]
per_s = 1000
burst = 1000

[[policies]]
name = "gpu-oom-smaller-batch"
kind = "jobs"
codes = ["CUDA_OUT_OF_MEMORY"]
action = "redrive"
delay_s = 0
budget = 2
hint = { batch_max_size = "1" }
""" + "".join(f"\n[tasks.{name}]\nenabled = false\n" for name in OTHER_TASKS)


class RecordingHandler(GpuJobHandler):
    """Records the job ids of every batch the batcher hands to the device."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.batches: list[list[str]] = []

    def _infer_blocking(self, quality: str, priority: Priority, items: list[_Item]) -> Any:
        self.batches.append([it.job_id for it in items])
        return super()._infer_blocking(quality, priority, items)


@pytest.fixture
async def handler(settings: Settings, storage: LocalFileStorage) -> AsyncIterator[RecordingHandler]:
    s = settings.with_overrides(device="cpu", foreground="none")  # noise: all foreground
    h = RecordingHandler(s, load_model("builtin"), storage, GpuMetrics.create(CollectorRegistry()))
    await h.startup()
    yield h
    await h.shutdown()


async def test_an_oom_job_is_dead_lettered_redriven_with_a_smaller_batch_and_completes(
    redis: Redis, settings: Settings, storage: LocalFileStorage, handler: RecordingHandler,
    tmp_path: Path,
) -> None:  # fmt: skip
    small = [sample_png(seed) for seed in range(3)]
    big = opaque_noise_png()
    fg = [int((decode_image(d, 128)[3] > 0.5).sum()) for d in [*small, big]]
    s = settings.with_overrides(
        batch_max_size=4,
        batch_max_wait_ms=500,
        worker_concurrency=8,
        device="cpu",
        foreground="none",
    )
    queue = JobQueue(redis, s)
    handler.budget = MemoryBudget(fg[3] - 1)  # the big job does not fit even alone
    big_job = (await queue.enqueue(await stored_spec(storage, big))).job_id

    worker = Worker(queue, s, handler)
    running = asyncio.create_task(worker.run())
    try:
        failed = await wait_for_status(queue, big_job, {"failed", "completed"}, timeout=60)
    finally:
        worker.stop()
        await finish_or_cancel(running)
    assert failed.error is not None
    assert (failed.status, failed.error.code) == ("failed", "CUDA_OUT_OF_MEMORY")
    assert failed.stage == "dead_lettered"
    assert (await job_events(redis, queue, big_job))[-1] == "3d_reconstruction.failed"
    [letter] = await queue.dead_letters(partition_of(big_job))
    assert (letter.job_id, letter.reason) == (big_job, "CUDA_OUT_OF_MEMORY")
    assert "does not fit" in letter.fields["last_error"]
    assert handler.batches == [[big_job]]

    # Later the device has room for the job alone, not beside a neighbour; three neighbours
    # arrive as the policy sweep redrives the job with the hint.
    handler.budget = MemoryBudget(fg[3] + min(fg[:3]) - 1)
    neighbours = [(await queue.enqueue(await stored_spec(storage, d))).job_id for d in small]
    (tmp_path / "redriver.toml").write_text(OOM_POLICY)
    config = config_at(tmp_path / "redriver.toml")
    scheduler = build_scheduler(queue, s, config, holder="test")
    result = await scheduler.run_now("redrive_sweep")
    assert isinstance(result, RunResult)
    assert result.outcome.value == "success", result.summary
    job = await queue.get(big_job)
    assert job is not None
    assert (job.status, dict(job.hints)) == ("queued", {"batch_max_size": "1"})
    assert await audit_actions(redis, queue, big_job) == ["redriven"]

    worker = Worker(queue, s, handler)
    running = asyncio.create_task(worker.run())
    try:
        for job_id in [big_job, *neighbours]:
            done = await wait_for_status(queue, job_id, {"completed", "failed"}, timeout=60)
            assert done.status == "completed", done.error
    finally:
        worker.stop()
        await finish_or_cancel(running)
    runs = [b for b in handler.batches[1:] if big_job in b]
    assert runs == [[big_job]]  # its own pass: no split, no OOM
    assert await queue.dead_letters(partition_of(big_job)) == []
