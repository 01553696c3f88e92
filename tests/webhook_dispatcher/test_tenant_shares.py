"""Per-tenant delivery shares, against a real dispatcher process and loopback receivers: a
tenant whose receivers answer just under the timeout never holds the slots another tenant's
webhook needs."""

from __future__ import annotations

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from splatq.services.webhook_dispatcher.policy import tenant_limit
from splatq.shared.engine.jobs import JobSpec
from splatq.shared.engine.queue import JobQueue
from splatq.shared.redis.server import RedisServer
from splatq.shared.testing import WorkerFactory, eventually, wait_for_status
from splatq.shared.webhooks.endpoints import EndpointStore
from tests.system.conftest import SpawnService
from tests.webhook_dispatcher.conftest import TimedReceiver

COMPLETED = "3d_reconstruction.completed"


def test_a_tenant_gets_its_share_and_an_even_split_when_others_have_work() -> None:
    """Half of 8 slots by default; with 3 tenants in flight, 64 slots split 21 each; never
    below one attempt, never above the share."""
    assert tenant_limit(8, 0.5, 1) == 4
    assert tenant_limit(8, 0.5, 2) == 4
    assert tenant_limit(64, 0.5, 3) == 21
    assert tenant_limit(64, 1.0, 1) == 64
    assert tenant_limit(2, 0.1, 1) == 1
    assert tenant_limit(8, 1.0, 100) == 1


async def _completed_jobs(
    queue: JobQueue, start_worker: WorkerFactory, tenant: str, n: int
) -> None:
    ids = [
        (await queue.enqueue(JobSpec(tenant=tenant, quality="preview", metadata={"n": i}))).job_id
        for i in range(n)
    ]
    await start_worker()
    for job_id in ids:
        await wait_for_status(queue, job_id, {"completed"})


@pytest.mark.slow
async def test_a_slow_tenant_never_holds_the_slots_another_tenant_needs(
    queue: JobQueue,
    redis_server: RedisServer,
    start_worker: WorkerFactory,
    spawn_service: SpawnService,
) -> None:
    """Tenant acme: three endpoints answering in 2.5 s (timeout 3 s), 8 events each, enough
    to fill all 8 slots of the dispatcher; tenant beta: one fast endpoint, one event queued
    after acme's backlog. beta's webhook arrives before acme's first answer, and acme never
    has more than its share (half of 8) of requests in flight. (Before per-tenant shares,
    acme held all 8 slots and beta waited for acme's backlog.)"""
    acme, beta = TimedReceiver(2.5), TimedReceiver()  # acme: 3 endpoints on one handler
    app = web.Application()
    for i in range(3):
        app.router.add_post(f"/acme{i}", acme.handle)
    app.router.add_post("/beta", beta.handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        endpoints = EndpointStore(queue)
        for i in range(3):
            await endpoints.create("acme", str(server.make_url(f"/acme{i}")), [COMPLETED])
        await endpoints.create("beta", str(server.make_url("/beta")), [COMPLETED])
        await _completed_jobs(queue, start_worker, "acme", 8)
        await _completed_jobs(queue, start_worker, "beta", 1)
        spawn_service(
            "dispatcher",
            redis_server.url,
            SPLATQ_WEBHOOK_ALLOW_PRIVATE="1",
            SPLATQ_WEBHOOK_TIMEOUT_S="3",
            SPLATQ_WEBHOOK_CONCURRENCY="8",
            SPLATQ_WEBHOOK_CONCURRENCY_PER_ENDPOINT="4",
        )

        async def beta_delivered() -> bool:
            return bool(beta.arrived)

        await eventually(beta_delivered, timeout=30)
        assert acme.arrived, "acme's backlog had not started: the test proves nothing"
        assert not acme.answered or beta.arrived[0] < min(acme.answered)

        async def second_wave() -> bool:
            return len(acme.arrived) >= 10  # acme's deferred messages came back and went out

        await eventually(second_wave, timeout=30)
        assert acme.most_in_flight <= 4
    finally:
        await server.close()
