"""The webhook dispatcher against real receivers on loopback: signed, retried durably,
classified, isolated per endpoint, SSRF-guarded, and surviving SIGKILL."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import orjson
import pytest
import standardwebhooks
from redis.asyncio import Redis

from splatq.services.webhook_dispatcher.dispatcher import Dispatcher
from splatq.services.webhook_dispatcher.policy import classify_response, should_deliver
from splatq.shared.engine.jobs import JobSpec
from splatq.shared.engine.queue import JobQueue
from splatq.shared.redis.server import RedisServer
from splatq.shared.settings import Settings
from splatq.shared.testing import WorkerFactory, eventually, service_env, wait_for_status
from splatq.shared.webhooks.store import WebhookStore
from tests.helpers import REPO_ROOT
from tests.webhook_dispatcher.conftest import ReceiverFactory, dispatcher_settings

COMPLETED = "3d_reconstruction.completed"


async def _job(queue: JobQueue, url: str, **metadata: Any) -> str:
    spec = JobSpec(
        tenant="acme",
        quality="preview",
        webhook_url=url,
        webhook_events=(COMPLETED,),
        metadata=metadata,
    )
    return (await queue.enqueue(spec)).job_id


async def _completed_job(
    queue: JobQueue, start_worker: WorkerFactory, url: str, **metadata: Any
) -> str:
    """A job with `url` as its webhook_url, run to completion (its events are in the outbox)."""
    job_id = await _job(queue, url, **metadata)
    await start_worker()
    await wait_for_status(queue, job_id, {"completed"})
    return job_id


def test_policy_classifies_answers_like_the_contract() -> None:
    """2xx delivered; 410 and other 4xx fail at once; 429/5xx/3xx retry; terminal events are
    always sent whatever the filter."""
    import random  # noqa: PLC0415

    rng = random.Random(0)
    assert classify_response(204, None, 1, 5, 10, 100, rng).outcome == "delivered"
    assert classify_response(410, None, 1, 5, 10, 100, rng).outcome == "failed"
    assert classify_response(400, None, 1, 5, 10, 100, rng).outcome == "failed"
    for status in (301, 408, 429, 500, 502, 503, 504):
        assert classify_response(status, None, 1, 5, 10, 100, rng).outcome == "retry"
    assert classify_response(503, None, 5, 5, 10, 100, rng).outcome == "failed"
    assert classify_response(429, "7", 1, 5, 10, 60_000, rng).delay_ms >= 7000
    assert should_deliver("3d_reconstruction.failed", ("3d_reconstruction.progress",))
    assert not should_deliver("3d_reconstruction.started", ("3d_reconstruction.progress",))


async def test_a_failing_receiver_gets_one_acked_delivery_with_a_stable_id(
    queue: JobQueue,
    settings: Settings,
    start_worker: WorkerFactory,
    start_dispatcher: Callable[[Settings], Dispatcher],
    receivers: ReceiverFactory,
) -> None:
    """503 three times then 200: four attempts, the same webhook-id each time, signatures the
    official Standard Webhooks library verifies, and the attempt log tells the story."""
    r = await receivers((503, {}, 0.0), (503, {}, 0.0), (503, {}, 0.0))
    job_id = await _completed_job(queue, start_worker, r.url, order="A-1")
    dispatcher = start_dispatcher(dispatcher_settings(settings))
    store = WebhookStore(queue)

    async def delivered() -> bool:
        log = await store.deliveries(job_id)
        return bool(log) and log[-1]["outcome"] == "delivered"

    await eventually(delivered, timeout=15)
    assert len(r.calls) == 4
    ids = {headers["webhook-id"] for _, headers, _ in r.calls}
    assert len(ids) == 1
    secret = await store.tenant_secret("acme")
    for _, headers, body in r.calls:
        payload = standardwebhooks.Webhook(secret).verify(body, headers)
        assert payload["event"] == COMPLETED
        assert payload["data"]["job_id"] == job_id
        assert payload["data"]["metadata"] == {"order": "A-1"}
    assert ids == {orjson.loads(r.calls[0][2])["id"]}
    log = await store.deliveries(job_id)
    assert [a["outcome"] for a in log] == ["retry", "retry", "retry", "delivered"]
    metrics = dispatcher.metrics
    assert metrics is not None
    assert metrics.attempts.labels("retry", "5xx")._value.get() == 3
    assert metrics.attempts.labels("delivered", "2xx")._value.get() == 1
    assert [a["status_code"] for a in log] == [503, 503, 503, 200]


async def test_retry_after_is_honoured(
    queue: JobQueue,
    settings: Settings,
    start_worker: WorkerFactory,
    start_dispatcher: Callable[[Settings], Dispatcher],
    receivers: ReceiverFactory,
) -> None:
    """429 with Retry-After: 1 -> the next attempt waits at least a second."""
    r = await receivers((429, {"Retry-After": "1"}, 0.0))
    await _completed_job(queue, start_worker, r.url)
    start_dispatcher(dispatcher_settings(settings, webhook_retry_cap_ms=5000))

    await r.wait_for_calls(2, timeout_s=10)
    assert r.calls[1][0] - r.calls[0][0] >= 0.95


async def test_gone_fails_at_once_and_is_dead_lettered(
    queue: JobQueue,
    redis: Redis,
    settings: Settings,
    start_worker: WorkerFactory,
    start_dispatcher: Callable[[Settings], Dispatcher],
    receivers: ReceiverFactory,
) -> None:
    """410 Gone: one attempt, the message fails and lands in the webhook dead letters."""
    r = await receivers((410, {}, 0.0))
    job_id = await _completed_job(queue, start_worker, r.url)
    start_dispatcher(dispatcher_settings(settings))
    dlq = queue.keys.webhook_dead_letters(0)

    async def dead() -> bool:
        return await redis.xlen(dlq) == 1

    await eventually(dead, timeout=10)
    [(_, fields)] = await redis.xrange(dlq)
    assert fields["job"] == job_id
    assert fields["reason"] == "gone"
    assert "410" in fields["detail"]
    assert fields["target"] == "job"
    assert len(r.calls) == 1


async def test_the_ssrf_guard_blocks_loopback_at_connect_time(
    queue: JobQueue,
    redis: Redis,
    settings: Settings,
    start_worker: WorkerFactory,
    start_dispatcher: Callable[[Settings], Dispatcher],
    receivers: ReceiverFactory,
) -> None:
    """With private addresses not allowed, a loopback webhook_url (a literal, or a name that
    resolves to loopback) fails as blocked and the receiver never sees a request; the
    tenant's delivery log and the dead letter say `blocked: private_address`, never what the
    name resolves to."""
    r = await receivers()
    job_ids = [
        await _completed_job(queue, start_worker, url)
        for url in (r.url, r.url.replace("127.0.0.1", "localhost"))
    ]
    start_dispatcher(dispatcher_settings(settings, webhook_allow_private=False))
    store = WebhookStore(queue)

    async def failed() -> bool:
        logs = [await store.deliveries(job_id) for job_id in job_ids]
        return all(log and log[-1]["outcome"] == "failed" for log in logs)

    await eventually(failed, timeout=10)
    attempts = [(await store.deliveries(job_id))[-1] for job_id in job_ids]
    assert [a["error"] for a in attempts] == ["blocked: private_address"] * 2
    letters = {f["job"]: f for _, f in await redis.xrange(queue.keys.webhook_dead_letters(0))}
    assert [letters[job_id]["reason"] for job_id in job_ids] == ["blocked", "blocked"]
    by_name = orjson.dumps([attempts[1], letters[job_ids[1]]]).decode()
    assert "127.0.0.1" not in by_name
    assert "loopback" not in by_name
    assert r.calls == []


async def test_a_slow_endpoint_does_not_delay_a_healthy_one(
    queue: JobQueue,
    settings: Settings,
    start_worker: WorkerFactory,
    start_dispatcher: Callable[[Settings], Dispatcher],
    receivers: ReceiverFactory,
) -> None:
    """An endpoint that takes 4 s to answer holds only its own deliveries."""
    slow = await receivers((200, {}, 4.0))
    fast = await receivers()
    slow_job = await _job(queue, slow.url)
    fast_job = await _job(queue, fast.url)
    await start_worker()
    for j in (slow_job, fast_job):
        await wait_for_status(queue, j, {"completed"})
    start_dispatcher(dispatcher_settings(settings, webhook_timeout_s=8.0))

    async def slow_started() -> bool:
        return bool(slow.calls)

    await eventually(slow_started, timeout=10)
    started = time.monotonic()

    async def fast_done() -> bool:
        return bool(fast.calls)

    await eventually(fast_done, timeout=10)
    assert time.monotonic() - started < 2.0


@pytest.mark.slow
async def test_a_sigkilled_dispatcher_loses_no_message(
    queue: JobQueue,
    redis_server: RedisServer,
    start_worker: WorkerFactory,
    receivers: ReceiverFactory,
) -> None:
    """Killed while its delivery is in flight: the claim expires and another dispatcher
    delivers the message (at least once; the webhook-id lets the receiver dedupe)."""
    r = await receivers((200, {}, 3.0))
    job_id = await _completed_job(queue, start_worker, r.url)
    env = service_env(
        redis_server.url,
        SPLATQ_WEBHOOK_ALLOW_PRIVATE="1",
        SPLATQ_WEBHOOK_TIMEOUT_S="1",
        SPLATQ_WEBHOOK_RETRY_BASE_MS="20",
        SPLATQ_WEBHOOK_RETRY_CAP_MS="200",
    )
    argv = [sys.executable, "-m", "splatq.services.cli", "dispatcher"]
    first = subprocess.Popen(  # noqa: ASYNC220 - returns at once
        argv,
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    second: subprocess.Popen[bytes] | None = None
    try:

        async def in_flight() -> bool:
            return bool(r.calls)

        await eventually(in_flight, timeout=20)
        first.send_signal(signal.SIGKILL)
        second = subprocess.Popen(  # noqa: ASYNC220 - returns at once
            argv,
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        store = WebhookStore(queue)

        async def delivered() -> bool:
            log = await store.deliveries(job_id)
            return any(a["outcome"] == "delivered" for a in log)

        await eventually(delivered, timeout=30)
        assert len({h["webhook-id"] for _, h, _ in r.calls}) == 1
        assert len(r.calls) >= 2
    finally:
        for p in (first, second):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(timeout=10)
