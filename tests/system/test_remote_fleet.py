"""SPLATQ_MODEL=remote with real worker processes (`splatq worker`) against the fake vendor on
loopback: the vendor's limits hold for the whole fleet, a SIGKILLed worker's prediction is
resumed rather than paid for twice, a 429 storm costs no attempt, a cancel reaches the vendor."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from splatq.shared.engine.queue import JobQueue
from splatq.shared.redis.server import RedisServer
from splatq.shared.storage.store import LocalFileStorage
from splatq.shared.testing import eventually, wait_for_status
from splatq.shared.vendor.notes import note_name
from tests.gpu_worker.conftest import opaque_noise_png, stored_spec
from tests.system.conftest import SpawnWorker
from tests.vendor.conftest import TOKEN_ENV, VendorFactory, write_config
from tests.vendor.fake_vendor import TOKEN, FakeVendor

pytestmark = pytest.mark.slow
HANDLER = "splatq.services.gpu_worker.handler:make"


def _spawn(
    spawn_worker: SpawnWorker,
    redis_server: RedisServer,
    config: Path,
    storage: LocalFileStorage,
    slots: int = 10,
) -> Any:
    return spawn_worker(
        redis_server.url,
        HANDLER,
        SPLATQ_MODEL="remote",
        SPLATQ_REMOTE_CONFIG=str(config),
        SPLATQ_STORAGE_URL=f"file://{storage.root}",
        SPLATQ_DEVICE="cpu",
        SPLATQ_WORKER_CONCURRENCY=str(slots),
        SPLATQ_INTERACTIVE_SHARE="1.0",
        SPLATQ_MAX_ATTEMPTS="5",
        **{TOKEN_ENV: TOKEN},
    )


async def _submit(queue: JobQueue, storage: LocalFileStorage, n: int) -> list[str]:
    """n jobs at once (one small input: the queue makes no cache answer of its own)."""
    spec = await stored_spec(storage, opaque_noise_png(64))
    return [(await queue.enqueue(spec)).job_id for _ in range(n)]


async def _all_done(queue: JobQueue, ids: list[str], timeout_s: float) -> list[Any]:
    return [
        await wait_for_status(queue, i, {"completed", "failed", "canceled"}, timeout=timeout_s)
        for i in ids
    ]


async def test_four_workers_keep_the_vendors_limits(
    queue: JobQueue,
    storage: LocalFileStorage,
    redis_server: RedisServer,
    spawn_worker: SpawnWorker,
    fake_vendor: VendorFactory,
    tmp_path: Path,
) -> None:
    """4 worker processes x 10 slots against a vendor allowing 5 in flight and 60 a minute
    (enforced over every 10-s window, stricter than a minute's): 18 jobs, predictions of
    0.5-7 s so that each limit binds in turn. Zero violations; every job completes with one
    prediction; the fleet used most of what the vendor allows."""
    vendor = await fake_vendor(rate=10, per_s=10, concurrency=5, durations=(0.5, 7.0, 2.0, 5.0))
    config = write_config(
        tmp_path / "vendor.toml",
        vendor.url,
        limits={"rate": 10, "per_s": 10, "concurrency": 5, "slot_ttl_s": 10},
    )
    for _ in range(4):
        _spawn(spawn_worker, redis_server, config, storage)
    ids = await _submit(queue, storage, 18)
    jobs = await _all_done(queue, ids, timeout_s=120)
    assert [j.status for j in jobs] == ["completed"] * 18, [j.error for j in jobs]
    assert vendor.violations == []
    assert vendor.created == 18
    assert set(vendor.created_per_key.values()) == {1}
    assert vendor.max_in_flight <= 5
    assert vendor.max_in_flight >= 4  # the concurrency limit was reached, not just kept
    spacing = (vendor.create_times[-1] - vendor.create_times[0]) / 17
    assert spacing < 1.6, spacing  # 1.03 s at the limiter's rate; waits for slots add some


async def test_a_sigkilled_worker_does_not_pay_for_a_second_prediction(
    queue: JobQueue,
    storage: LocalFileStorage,
    redis_server: RedisServer,
    spawn_worker: SpawnWorker,
    fake_vendor: VendorFactory,
    tmp_path: Path,
) -> None:
    """SIGKILL while the job waits on its prediction: the worker that takes the job over finds
    the prediction id noted in the job and polls it -- one create request, one prediction --
    and the job completes."""
    vendor = await fake_vendor(duration_s=6.0)
    config = write_config(tmp_path / "vendor.toml", vendor.url)
    victim = _spawn(spawn_worker, redis_server, config, storage, slots=2)
    [job_id] = await _submit(queue, storage, 1)

    async def noted() -> bool:
        job = await queue.get(job_id)
        return job is not None and bool(job.notes.get(note_name("preview", "pred")))

    await eventually(noted, timeout=60)
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=10)
    _spawn(spawn_worker, redis_server, config, storage, slots=2)
    [job] = await _all_done(queue, [job_id], timeout_s=60)
    assert job.status == "completed", job.error
    assert job.deliveries == 2
    assert [r for r in vendor.requests if r[0] == "create"] == [
        ("create", next(iter(vendor.created_per_key)))
    ]
    assert vendor.created == 1


async def test_a_429_storm_costs_no_attempt(
    queue: JobQueue,
    storage: LocalFileStorage,
    redis_server: RedisServer,
    spawn_worker: SpawnWorker,
    fake_vendor: VendorFactory,
    tmp_path: Path,
) -> None:
    """For its first 6 s the vendor answers every create 429 (Retry-After 3 s, over the 1 s
    waited in the worker: the jobs are deferred). Every job completes with attempts 1; the
    lane paused; some jobs were deferred."""
    vendor = await fake_vendor(duration_s=0.3, storm_retry_after_s=3.0)
    vendor.storm_until = time.monotonic() + 600  # 6 s from the first request, set below
    config = write_config(tmp_path / "vendor.toml", vendor.url, wait={"inline_max_s": 1})
    for _ in range(2):
        _spawn(spawn_worker, redis_server, config, storage, slots=5)
    ids = await _submit(queue, storage, 10)

    async def first_create() -> bool:
        return bool(vendor.requests)

    await eventually(first_create, timeout=60)
    vendor.storm_until = time.monotonic() + 6
    jobs = await _all_done(queue, ids, timeout_s=90)
    assert [j.status for j in jobs] == ["completed"] * 10, [j.error for j in jobs]
    assert [j.attempts for j in jobs] == [1] * 10
    assert vendor.answers[429] >= 1
    assert sum(j.deferrals for j in jobs) >= 1
    assert vendor.created == 10


async def test_a_cancel_reaches_the_vendor_from_a_worker_process(
    queue: JobQueue,
    storage: LocalFileStorage,
    redis_server: RedisServer,
    spawn_worker: SpawnWorker,
    fake_vendor: VendorFactory,
    tmp_path: Path,
) -> None:
    """A job canceled while its prediction runs: the worker forwards it to the vendor's
    cancel endpoint and the job ends canceled."""
    vendor: FakeVendor = await fake_vendor(duration_s=60)
    config = write_config(tmp_path / "vendor.toml", vendor.url)
    _spawn(spawn_worker, redis_server, config, storage, slots=2)
    [job_id] = await _submit(queue, storage, 1)

    async def created() -> bool:
        return vendor.created == 1

    await eventually(created, timeout=60)
    await asyncio.sleep(0.2)
    await queue.cancel(job_id)
    [job] = await _all_done(queue, [job_id], timeout_s=30)
    assert job.status == "canceled"
    assert vendor.canceled == ["p00001"]
