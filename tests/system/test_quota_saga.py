"""The GPU-quota saga end to end: a settler process SIGKILLed at each step boundary never
charges or refunds twice, and a failure injected at the publish step rolls back (no
artifacts, reservation released, the job failed with its event)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from redis.asyncio import Redis

from splatq.services.quota_settler.settler import SETTLER_GROUP, Boundary, Settler
from splatq.shared.engine.ids import partition_of
from splatq.shared.engine.jobs import JobSpec
from splatq.shared.engine.queue import JobQueue
from splatq.shared.errors import PermanentError
from splatq.shared.settings import Settings
from splatq.shared.storage.store import LocalFileStorage
from splatq.shared.tenants.quota import QuotaBook
from splatq.shared.testing import (
    WorkerFactory,
    eventually,
    job_events,
    service_env,
    wait_for_status,
)
from tests.gateway.conftest import AUTH_A, ClientFactory, make_client  # noqa: F401 - a fixture
from tests.gateway.test_api import form
from tests.helpers import REPO_ROOT, GpuHandlerFactory

ESTIMATE_MS = 5_000
OUTCOMES = {"ok": 3, "permanent": 2, "cancel": 1}


async def _reserved_jobs(queue: JobQueue, book: QuotaBook) -> dict[str, str]:
    """Jobs of tenant acme, each reserved first (as the gateway does); job_id -> outcome."""
    jobs = {}
    for outcome, count in OUTCOMES.items():
        for n in range(count):
            meta = {"fail": "permanent"} if outcome == "permanent" else {"n": n}
            spec = JobSpec(tenant="acme", quality="preview", metadata=meta)
            job_id = queue.new_job_id(spec)
            assert (await book.reserve("acme", job_id, ESTIMATE_MS)).granted
            await queue.enqueue(spec, job_id=job_id)
            if outcome == "cancel":
                assert await queue.cancel(job_id, "acme") == "canceled"
            jobs[job_id] = outcome
    return jobs


def _spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", *args], cwd=REPO_ROOT, env=env, stdout=out, stderr=out
        )


async def _pending(redis: Redis, queue: JobQueue) -> int:
    info = await redis.xpending(queue.keys.events(0), SETTLER_GROUP)
    return int(info["pending"])


@pytest.mark.parametrize("boundary", list(Boundary))
async def test_settler_killed_at_each_boundary_charges_and_refunds_once(
    boundary: Boundary,
    redis: Redis,
    queue: JobQueue,
    settings: Settings,
    start_worker: WorkerFactory,
    tmp_path: Path,
) -> None:
    book = QuotaBook(redis)
    await book.note_tenant("acme")
    jobs = await _reserved_jobs(queue, book)
    await start_worker()
    for job_id in jobs:
        await wait_for_status(queue, job_id, {"completed", "failed", "canceled"})
    assert (await book.usage("acme")).reserved_ms == ESTIMATE_MS * len(jobs)
    env = service_env(
        settings.redis_url,
        SPLATQ_QUOTA_RECLAIM_IDLE_MS="100",
        SPLATQ_QUOTA_SWEEP_INTERVAL_S="3600",
        SPLATQ_QUOTA_SWEEP_GRACE_S="3600",
    )
    crashing = _spawn(["tests.quota_crash_settler", boundary.value], env, tmp_path / "s1.log")
    assert await asyncio.to_thread(crashing.wait, 60) == -signal.SIGKILL
    usage = await book.usage("acme")
    if boundary is Boundary.READ:  # read, nothing applied yet
        assert usage.used_ms == 0
        assert await _pending(redis, queue) > 0
    elif boundary is Boundary.APPLIED:  # applied, not acknowledged: will be read again
        assert usage.used_ms > 0
        assert await _pending(redis, queue) > 0
    else:
        assert await _pending(redis, queue) == 0
    # A healthy settler takes over what the dead one left pending, and the rest.
    healthy = _spawn(["splatq.services.quota_settler"], env, tmp_path / "s2.log")
    try:

        async def all_done() -> bool:
            return not await book.open_reservations("acme") and not await _pending(redis, queue)

        await eventually(all_done, timeout=30)
    finally:
        healthy.send_signal(signal.SIGTERM)
        await asyncio.to_thread(healthy.wait, 30)
    expected = 0
    for job_id, outcome in jobs.items():
        ledger = await book.ledger("acme", job_id)
        if outcome == "ok":
            job = await queue.get(job_id)
            assert job is not None
            assert job.compute_time_ms is not None
            expected += job.compute_time_ms
            assert job.metered == {"job": job.compute_time_ms}
            assert set(ledger) == {"reserve", "charge", "charged_ms", "u.job"}
        elif outcome == "cancel":  # canceled while queued: charged, for no work
            assert set(ledger) == {"reserve", "charge", "charged_ms"}
            assert ledger["charged_ms"] == "0"
        else:  # a failure the platform is blamed for (not the input's code): waived
            assert set(ledger) == {"reserve", "release"}
    usage = await book.usage("acme")
    assert (usage.reserved_ms, usage.used_ms) == (0, expected)
    # Every event delivered once more, and a sweep: nothing changes.
    again = Settler(queue, book, consumer="replay")
    for _, fields in await redis.xrange(queue.keys.events(0)):
        await again.apply(fields)
    assert await again.sweep(grace_s=0) == 0
    assert await book.usage("acme") == usage


async def test_failure_at_publish_rolls_back(
    make_client: ClientFactory,  # noqa: F811 - the imported fixture
    redis: Redis,
    queue: JobQueue,
    storage: LocalFileStorage,
    gpu_handler_factory: GpuHandlerFactory,
    start_worker: WorkerFactory,
    settings: Settings,
) -> None:
    """Step 3 fails after one artifact was committed: the files are gone, the job failed
    with its event, and the settler gave the whole reservation back."""
    client: TestClient[Any, Any] = await make_client(
        quota_estimates_ms={"preview": ESTIMATE_MS, "full": ESTIMATE_MS}
    )
    handler = await gpu_handler_factory(settings)
    published: list[str] = []

    async def fail_second_file(name: str) -> None:
        if published:
            raise PermanentError("injected failure at publish", code="PUBLISH_FAILED")
        published.append(name)

    handler.before_commit = fail_second_file
    await start_worker(handler)
    book = QuotaBook(redis)
    settler = Settler(queue, book, consumer="test")
    await settler.setup()
    resp = await client.post("/v1/jobs", data=form(params={"quality": "preview"}), headers=AUTH_A)
    assert resp.status == 202
    job_id = (await resp.json())["id"]
    assert (await book.usage("acme")).reserved_ms == ESTIMATE_MS
    job = await wait_for_status(queue, job_id, {"completed", "failed"}, timeout=60)
    assert job.status == "failed"
    assert job.error is not None
    assert job.error.code == "PUBLISH_FAILED"
    assert "3d_reconstruction.failed" in await job_events(redis, queue, job_id)
    assert published  # one file was committed before the failure ...
    artifacts = storage.root / "artifacts" / job_id
    leftovers = [p for p in artifacts.rglob("*") if p.is_file()] if artifacts.exists() else []
    assert leftovers == []  # ... and removed with the staged ones
    while await settler.step(partition_of(job_id), block_ms=50):
        pass
    usage = await book.usage("acme")
    assert (usage.reserved_ms, usage.used_ms) == (0, 0)
    ledger = await book.ledger("acme", job_id)
    assert set(ledger) == {"reserve", "release"}
    assert ledger["release"].endswith("|failed")
