"""The GPU quota where it meets progressive results, cancel and idempotency, through the HTTP
API on real Redis with the real stage workers: a canceled progressive job pays for the work it
got (item 1 of #21), and a resend racing a cancel never makes a job without a reservation
(item 3)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from redis.asyncio import Redis

from splatq.services.gpu_worker.stages import StageHandlers
from splatq.services.quota_settler.settler import Settler
from splatq.shared.engine.jobs import JobSpec
from splatq.shared.engine.metering import quick_unit
from splatq.shared.engine.queue import JobQueue
from splatq.shared.engine.stages import PipelineStage
from splatq.shared.settings import Settings
from splatq.shared.storage.store import LocalFileStorage
from splatq.shared.tenants.quota import QuotaBook
from splatq.shared.testing import StagesFactory, eventually
from tests.gateway.conftest import AUTH_A, ClientFactory
from tests.gateway.test_api import form, problem
from tests.gateway.test_tenants_api import ADMIN, _admin_client
from tests.pipeline.test_progressive import make_stage_handlers

Client = TestClient[Any, Any]
ESTIMATES = {"preview": 1_000, "full": 2_000}


@pytest.fixture
async def stage_handlers(
    settings: Settings, storage: LocalFileStorage
) -> AsyncIterator[StageHandlers]:
    h = make_stage_handlers(settings, storage)
    await h.startup(tuple(PipelineStage))
    yield h
    await h.shutdown()


async def drain(settler: Settler) -> None:
    for partition in range(settler.settings.partitions):
        while await settler.step(partition, block_ms=50):
            pass


async def view(client: Client, job_id: str) -> dict[str, Any]:
    resp = await client.get(f"/v1/jobs/{job_id}", headers=AUTH_A)
    assert resp.status == 200
    doc: dict[str, Any] = await resp.json()
    return doc


async def test_a_canceled_progressive_job_is_charged_for_the_quick_result_it_got(
    make_client: ClientFactory,
    stage_handlers: StageHandlers,
    start_stages: StagesFactory,
    queue: JobQueue,
    redis: Redis,
) -> None:
    """A tenant whose quota covers one progressive job takes its quick result and cancels:
    the device work it got is charged, the quota then holds, and the quick files it paid for
    stay downloadable."""
    client = await _admin_client(make_client, quota_estimates_ms=ESTIMATES)
    limit_s = (ESTIMATES["full"] + ESTIMATES["preview"]) / 1000
    await client.put(
        "/v1/admin/tenants/acme/quota", json={"gpu_seconds": limit_s, "period": "day"},
        headers=ADMIN,
    )  # fmt: skip
    book = QuotaBook(redis)
    settler = Settler(queue, book, consumer="test")
    await settler.setup()
    await start_stages(stage_handlers, "all")
    params = {"quality": "full", "progressive": True, "cache": False}
    resp = await client.post("/v1/jobs", data=form(params=params), headers=AUTH_A)
    assert resp.status == 202, await resp.text()
    job_id = (await resp.json())["id"]

    async def quick_ready() -> bool:
        job = await queue.get(job_id)
        return job is not None and bool(job.quick_run)

    await eventually(quick_ready, timeout=60, interval=0.02)
    canceled = await client.post(f"/v1/jobs/{job_id}/cancel", headers=AUTH_A)
    assert canceled.status in (200, 202), await canceled.text()

    async def ended() -> bool:
        return (await view(client, job_id))["status"] in {"canceled", "completed"}

    await eventually(ended, timeout=60)
    await drain(settler)
    job = await queue.get(job_id)
    assert job is not None
    quick = [u for u in job.metered if u.startswith(quick_unit(""))]
    assert len(quick) == 1, job.metered  # the quick result is one unit of work, metered
    charged = await book.charged_units("acme", job_id)
    assert charged == dict(job.metered)
    assert sum(charged.values()) > 0
    usage = await (await client.get("/v1/usage", headers=AUTH_A)).json()
    assert usage["reserved_gpu_seconds"] == 0
    assert usage["used_gpu_seconds"] == sum(charged.values()) / 1000
    # the quota is now a limit: the same job again does not fit what is left
    again = await client.post("/v1/jobs", data=form(params=params), headers=AUTH_A)
    await problem(again, 429, "quota_exceeded")
    if job.status.value == "canceled":
        quick_file = await client.get(
            f"/v1/jobs/{job_id}/artifacts/splat?variant=quick", headers=AUTH_A
        )
        assert quick_file.status == 200  # paid for: still the tenant's


async def test_join_only_never_creates_a_job(queue: JobQueue) -> None:
    """The enqueue a quota gate without a reservation makes: it answers the job holding the
    key, and creates nothing once that job's claim ended (canceled or failed)."""
    spec = JobSpec(tenant="acme", quality="preview", idempotency_key="idempotency:acme:k1")
    first = await queue.enqueue(spec)
    assert first.created
    joined = await queue.enqueue(spec, job_id=queue.new_job_id(spec), join_only=True)
    assert (joined.created, joined.job_id) == (False, first.job_id)
    assert await queue.cancel(first.job_id, "acme") == "canceled"  # the claim is FAILED now
    late = await queue.enqueue(spec, job_id=queue.new_job_id(spec), join_only=True)
    assert late.not_joined
    assert not late.created
    fresh = JobSpec(tenant="acme", quality="preview", idempotency_key="idempotency:acme:k2")
    assert (await queue.enqueue(fresh, join_only=True)).not_joined  # never claimed at all


async def test_a_resend_racing_a_cancel_never_makes_a_job_without_a_reservation(
    make_client: ClientFactory, queue: JobQueue, redis: Redis
) -> None:
    """Quota for one preview; each round submits a job with a fresh Idempotency-Key, then
    races its cancel against a resend with the same key. The resend gets the job, or 429 --
    never a second job (no workers run: each job waits, then is canceled)."""
    client = await _admin_client(make_client, quota_estimates_ms=ESTIMATES)
    await client.put(
        "/v1/admin/tenants/acme/quota", json={"gpu_seconds": 1, "period": "day"}, headers=ADMIN
    )
    book = QuotaBook(redis)
    settler = Settler(queue, book, consumer="test")
    await settler.setup()
    made: set[str] = set()
    for n in range(40):
        headers = {**AUTH_A, "Idempotency-Key": f"race-{n}"}
        body = form(params={"quality": "preview"})
        first = await client.post("/v1/jobs", data=body, headers=headers)
        assert first.status == 202, await first.text()
        job_id = (await first.json())["id"]
        made.add(job_id)
        cancel, resend = await asyncio.gather(
            client.post(f"/v1/jobs/{job_id}/cancel", headers=AUTH_A),
            client.post("/v1/jobs", data=form(params={"quality": "preview"}), headers=headers),
        )
        assert cancel.status in (200, 202)
        if resend.status == 429:
            assert (await resend.json())["code"] == "quota_exceeded"
        else:
            assert resend.status in (200, 202), await resend.text()
            assert (await resend.json())["id"] == job_id
        await drain(settler)  # the canceled job's reservation closes
        assert not await book.open_reservations("acme")
    listed = await client.get("/v1/jobs?limit=100", headers=AUTH_A)
    ids = {j["id"] for j in (await listed.json())["items"]}
    assert ids == made  # one job per key, each of them reserved
    for job_id in made:
        assert "reserve" in await book.ledger("acme", job_id)
