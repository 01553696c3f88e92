"""Registered webhook endpoints, delivered by a real dispatcher to loopback receivers: fan-out
by subscription, per-endpoint secrets and rotation, the circuit breaker, auto-disable, 410,
deletion, recover, and one Redis Cluster slot per script call."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable

import orjson
import pytest
import standardwebhooks
from aiohttp import web
from aiohttp.test_utils import TestServer
from redis.asyncio import Redis

from splatq.services.webhook_dispatcher.dispatcher import Dispatcher
from splatq.shared.engine.jobs import JobSpec
from splatq.shared.engine.queue import JobQueue
from splatq.shared.redis.server import RedisServer
from splatq.shared.settings import Settings
from splatq.shared.testing import WorkerFactory, eventually, service_env, wait_for_status
from splatq.shared.webhooks.endpoints import Endpoint, EndpointStore
from splatq.shared.webhooks.store import AttemptResult, WebhookStore
from tests.helpers import REPO_ROOT
from tests.webhook_dispatcher.conftest import (
    Receiver,
    ReceiverFactory,
    TimedReceiver,
    dispatcher_settings,
)

COMPLETED = "3d_reconstruction.completed"
QUEUED = "3d_reconstruction.queued"
STARTED = "3d_reconstruction.started"


async def _completed_jobs(queue: JobQueue, start_worker: WorkerFactory, n: int) -> list[str]:
    """n jobs of tenant acme, without a webhook_url, run to completion."""
    ids = [
        (await queue.enqueue(JobSpec(tenant="acme", quality="preview", metadata={"n": i}))).job_id
        for i in range(n)
    ]
    await start_worker()
    for job_id in ids:
        await wait_for_status(queue, job_id, {"completed"})
    return ids


def _events(r: Receiver) -> list[str]:
    return [orjson.loads(body)["event"] for _, _, body in r.calls]


async def _endpoint(store: EndpointStore, endpoint_id: str) -> Endpoint:
    endpoint = await store.get("acme", endpoint_id)
    assert endpoint is not None
    return endpoint


async def test_each_endpoint_gets_its_subscribed_events_signed_with_its_own_secret(
    queue: JobQueue,
    settings: Settings,
    start_worker: WorkerFactory,
    start_dispatcher: Callable[[Settings], Dispatcher],
    receivers: ReceiverFactory,
) -> None:
    """One endpoint subscribed to `completed`, one to everything, another tenant's endpoint:
    each gets exactly its events, once, with the event id as webhook-id, verifiable with its
    own secret only."""
    only_completed, everything, other_tenant = (
        await receivers(),
        await receivers(),
        await receivers(),
    )
    store = EndpointStore(queue)
    a = await store.create("acme", only_completed.url, [COMPLETED])
    b = await store.create("acme", everything.url, [])
    await store.create("beta", other_tenant.url, [])
    [job_id] = await _completed_jobs(queue, start_worker, 1)
    start_dispatcher(dispatcher_settings(settings))

    async def delivered() -> bool:
        log = await WebhookStore(queue).deliveries(job_id)
        return sum(d["outcome"] == "delivered" for d in log) == 4

    await eventually(delivered, timeout=15)
    assert _events(only_completed) == [COMPLETED]
    assert sorted(_events(everything)) == sorted([QUEUED, STARTED, COMPLETED])
    assert other_tenant.calls == []
    _, headers, body = only_completed.calls[0]
    payload = standardwebhooks.Webhook(a.secret).verify(body, headers)
    assert payload["data"]["job_id"] == job_id
    assert headers["webhook-id"] == payload["id"]
    with pytest.raises(standardwebhooks.WebhookVerificationError):
        standardwebhooks.Webhook(b.secret).verify(body, headers)
    for _, headers, body in everything.calls:
        standardwebhooks.Webhook(b.secret).verify(body, headers)
    deliveries = await WebhookStore(queue).deliveries(job_id)
    assert {d["target"] for d in deliveries} == {a.id, b.id}
    assert all(d["outcome"] == "delivered" for d in deliveries)


async def test_after_a_rotation_old_and_new_secrets_both_verify(
    queue: JobQueue,
    settings: Settings,
    start_worker: WorkerFactory,
    start_dispatcher: Callable[[Settings], Dispatcher],
    receivers: ReceiverFactory,
) -> None:
    """Rotate: deliveries carry two signatures, so a receiver holding either secret accepts;
    after the overlap only the new secret signs."""
    r = await receivers()
    store = EndpointStore(queue)
    created = await store.create("acme", r.url, [COMPLETED])
    rotated = await store.rotate_secret("acme", created.id)
    assert rotated is not None
    assert rotated.secret != created.secret
    assert rotated.previous_secret == created.secret
    assert rotated.previous_expires_ms > time.time() * 1000 + 23 * 3600 * 1000
    await _completed_jobs(queue, start_worker, 1)
    start_dispatcher(dispatcher_settings(settings))

    await r.wait_for_calls(1, timeout_s=15)
    _, headers, body = r.calls[0]
    assert len(headers["webhook-signature"].split(" ")) == 2
    for secret in (created.secret, rotated.secret):
        standardwebhooks.Webhook(secret).verify(body, headers)

    # With no overlap left, the old secret no longer signs.
    await queue.redis.hset(
        queue.keys.webhook_endpoint("acme", created.id), "previous_expires_ms", 1
    )
    await _completed_jobs(queue, start_worker, 1)

    await r.wait_for_calls(2, timeout_s=15)
    _, headers, body = r.calls[1]
    assert len(headers["webhook-signature"].split(" ")) == 1
    standardwebhooks.Webhook(rotated.secret).verify(body, headers)
    with pytest.raises(standardwebhooks.WebhookVerificationError):
        standardwebhooks.Webhook(created.secret).verify(body, headers)


async def test_the_circuit_opens_holds_back_and_a_probe_closes_it(
    queue: JobQueue,
    settings: Settings,
    start_worker: WorkerFactory,
    start_dispatcher: Callable[[Settings], Dispatcher],
    receivers: ReceiverFactory,
) -> None:
    """Consecutive failures open the circuit: no request reaches the endpoint until the
    cool-down ends; then one probe, and when it succeeds every held message is delivered,
    each exactly once, without spending attempts while held."""
    r = await receivers(default_status=500)
    store = EndpointStore(queue)
    ep = await store.create("acme", r.url, [COMPLETED])
    job_ids = await _completed_jobs(queue, start_worker, 6)
    dispatcher = start_dispatcher(
        dispatcher_settings(
            settings,
            webhook_breaker_consecutive=3,
            webhook_breaker_open_ms=1500,
            webhook_max_attempts=50,
            webhook_concurrency=1,
        )
    )

    async def opened() -> bool:
        return (await _endpoint(store, ep.id)).circuit == "open"

    await eventually(opened, timeout=15)
    seen_open_ms = int(time.time() * 1000)
    r.default_status = 200
    open_until = (await _endpoint(store, ep.id)).open_until_ms
    assert open_until > seen_open_ms

    async def all_delivered() -> bool:
        logs = [await WebhookStore(queue).deliveries(j) for j in job_ids]
        return all(log and log[-1]["outcome"] == "delivered" for log in logs)

    await eventually(all_delivered, timeout=20)
    held = [t for t in r.wall_times_ms if seen_open_ms + 100 < t < open_until - 50]
    assert held == [], "requests reached the endpoint while its circuit was open"
    endpoint = await _endpoint(store, ep.id)
    assert endpoint.circuit == "closed"
    assert endpoint.consecutive_failures == 0
    metrics = dispatcher.metrics
    assert metrics is not None
    assert metrics.circuit_transitions.labels("open")._value.get() >= 1
    assert metrics.deferred.labels("circuit_open")._value.get() >= 1
    for job_id in job_ids:
        log = await WebhookStore(queue).deliveries(job_id)
        # Exactly one success per message, and no attempt numbers spent while held back.
        assert [a["outcome"] for a in log].count("delivered") == 1
        assert [a["attempt"] for a in log] == list(range(1, len(log) + 1))
    logs = [await WebhookStore(queue).deliveries(j) for j in job_ids]
    probes = [a for log in logs for a in log if a.get("probe")]
    assert probes
    assert probes[-1]["outcome"] == "delivered"


async def test_an_endpoint_failing_for_too_long_is_disabled_then_recovered(
    queue: JobQueue,
    redis: Redis,
    settings: Settings,
    start_worker: WorkerFactory,
    start_dispatcher: Callable[[Settings], Dispatcher],
    receivers: ReceiverFactory,
) -> None:
    """Failing continuously past the disable period disables the endpoint: nothing more is
    sent, its messages are dead-lettered (`endpoint_disabled`). Enabled again, `recover`
    sends them, and they are delivered."""
    r = await receivers(default_status=503)
    store = EndpointStore(queue)
    ep = await store.create("acme", r.url, [COMPLETED])
    started_ms = int(time.time() * 1000)
    job_ids = await _completed_jobs(queue, start_worker, 2)
    start_dispatcher(
        dispatcher_settings(
            settings,
            webhook_disable_after_s=1,
            webhook_breaker_consecutive=10_000,
            webhook_breaker_min_attempts=10_000,
            webhook_max_attempts=1000,
            webhook_retry_base_ms=50,
            webhook_retry_cap_ms=100,
        )
    )
    dlq = queue.keys.webhook_dead_letters(0)

    async def disabled_and_dead_lettered() -> bool:
        return not (await _endpoint(store, ep.id)).enabled and await redis.xlen(dlq) == 2

    await eventually(disabled_and_dead_lettered, timeout=15)
    endpoint = await _endpoint(store, ep.id)
    assert "continuously" in endpoint.disabled_reason
    assert endpoint.failing_since_ms >= started_ms
    entries = await redis.xrange(dlq)
    assert {f["reason"] for _, f in entries} == {"endpoint_disabled"}
    assert {f["target"] for _, f in entries} == {ep.id}
    calls_when_disabled = len(r.calls)

    r.default_status = 200
    assert (await store.update("acme", ep.id, enabled=True)) is not None
    result = await store.recover("acme", ep.id, started_ms)
    assert (result.recovered, result.expired, result.truncated) == (2, 0, False)

    async def delivered() -> bool:
        logs = [await WebhookStore(queue).deliveries(j) for j in job_ids]
        return all(log and log[-1]["outcome"] == "delivered" for log in logs)

    await eventually(delivered, timeout=15)
    assert len(r.calls) == calls_when_disabled + 2
    assert await redis.xlen(dlq) == 0
    assert (await _endpoint(store, ep.id)).failing_since_ms == 0
    # Recovering again finds nothing: the messages were delivered.
    again = await store.recover("acme", ep.id, started_ms)
    assert again.recovered == 0


async def test_410_disables_the_endpoint_and_later_events_are_dead_lettered_unsent(
    queue: JobQueue,
    redis: Redis,
    settings: Settings,
    start_worker: WorkerFactory,
    start_dispatcher: Callable[[Settings], Dispatcher],
    receivers: ReceiverFactory,
) -> None:
    r = await receivers((410, {}, 0.0))
    store = EndpointStore(queue)
    ep = await store.create("acme", r.url, [COMPLETED])
    await _completed_jobs(queue, start_worker, 1)
    start_dispatcher(dispatcher_settings(settings))

    async def disabled() -> bool:
        return not (await _endpoint(store, ep.id)).enabled

    await eventually(disabled, timeout=15)
    assert "410" in (await _endpoint(store, ep.id)).disabled_reason
    await _completed_jobs(queue, start_worker, 1)
    dlq = queue.keys.webhook_dead_letters(0)

    async def both_dead() -> bool:
        return await redis.xlen(dlq) == 2

    await eventually(both_dead, timeout=15)
    reasons = sorted(f["reason"] for _, f in await redis.xrange(dlq))
    assert reasons == ["endpoint_disabled", "gone"]
    assert len(r.calls) == 1


async def test_a_deleted_endpoint_gets_nothing_more(
    queue: JobQueue,
    redis: Redis,
    settings: Settings,
    start_worker: WorkerFactory,
    start_dispatcher: Callable[[Settings], Dispatcher],
    receivers: ReceiverFactory,
) -> None:
    """Deleting an endpoint drops its pending messages (no request, no dead letter)."""
    r = await receivers((503, {"Retry-After": "1"}, 0.0))
    store = EndpointStore(queue)
    ep = await store.create("acme", r.url, [COMPLETED])
    [job_id] = await _completed_jobs(queue, start_worker, 1)
    start_dispatcher(dispatcher_settings(settings, webhook_retry_cap_ms=5000))

    async def first_try() -> bool:
        return len(await WebhookStore(queue).deliveries(job_id)) == 1

    await eventually(first_try, timeout=15)
    assert await store.delete("acme", ep.id)

    async def dropped() -> bool:
        log = await WebhookStore(queue).deliveries(job_id)
        return log[-1]["outcome"] == "dropped"

    await eventually(dropped, timeout=15)
    assert len(r.calls) == 1
    assert await redis.xlen(queue.keys.webhook_dead_letters(0)) == 0
    assert await redis.zcard(queue.keys.webhook_due(0)) == 0


async def test_every_webhook_script_call_stays_in_one_cluster_slot(
    queue: JobQueue,
    settings: Settings,
    start_worker: WorkerFactory,
    start_dispatcher: Callable[[Settings], Dispatcher],
    receivers: ReceiverFactory,
) -> None:
    """Fan-out, claim, gate, result, health, endpoint management and recover: each Lua
    call's KEYS hash to one slot."""
    from redis.crc import key_slot  # noqa: PLC0415

    seen: list[tuple[str, list[str]]] = []
    r = await receivers((500, {}, 0.0))
    settings = dispatcher_settings(settings)
    dispatcher = start_dispatcher(settings)
    for runner in (queue.scripts, dispatcher.queue.scripts):
        original = runner._execute

        async def recording(calls, original=original):  # type: ignore[no-untyped-def]
            seen.extend((c.script.value, list(c.keys)) for c in calls)
            return await original(calls)

        runner._execute = recording  # type: ignore[method-assign]
    store = EndpointStore(queue)
    ep = await store.create("acme", r.url, [COMPLETED])
    await store.rotate_secret("acme", ep.id)
    await store.update("acme", ep.id, events=[COMPLETED])
    await _completed_jobs(queue, start_worker, 1)

    await r.wait_for_calls(2, timeout_s=15)
    await store.recover("acme", ep.id, 0)
    await store.delete("acme", ep.id)
    scripts = {name for name, _ in seen}
    assert {"wh_fanout", "wh_claim_due", "wh_result_batch", "wh_ep_gate", "wh_ep_record",
            "wh_ep_create", "wh_ep_rotate", "wh_ep_update", "wh_ep_delete"} <= scripts  # fmt: skip
    for name, keys in seen:
        assert len({key_slot(k.encode()) for k in keys}) == 1, (name, keys)


async def test_health_folds_a_batch_of_results_in_order(queue: JobQueue) -> None:
    """The breaker's rules on one endpoint, as the recorder applies them (one call per
    batch): a streak opens, a success closes, the ratio rule trips, a gone disables."""

    def store_with(**breaker: float) -> EndpointStore:
        overrides = {"webhook_breaker_consecutive": 3, "webhook_breaker_min_attempts": 4,
                     "webhook_breaker_open_ms": 1000, **breaker}  # fmt: skip
        return EndpointStore(JobQueue(queue.redis, queue.settings.with_overrides(**overrides)))

    async def fold(store: EndpointStore, endpoint_id: str, *outcomes: str) -> str:
        reply = await store.scripts.run(store.record_call("acme", endpoint_id, outcomes, []))
        return EndpointStore.parse_health(reply).state

    streaks = store_with(webhook_breaker_ratio=0.9)
    ep = await streaks.create("acme", "https://93.184.216.34/h", [])
    assert await fold(streaks, ep.id, "fail", "fail") == "closed"
    # A success restarts the streak; 4 of 5 failed is under the 0.9 ratio.
    assert await fold(streaks, ep.id, "ok", "fail", "fail") == "closed"
    assert await fold(streaks, ep.id, "fail") == "open"  # three in a row
    opened = await _endpoint(streaks, ep.id)
    assert opened.open_until_ms > time.time() * 1000 + 500
    assert opened.failing_since_ms > 0
    assert await fold(streaks, ep.id, "ok") == "closed"
    closed = await _endpoint(streaks, ep.id)
    assert (closed.consecutive_failures, closed.failing_since_ms, closed.open_until_ms) == (0, 0, 0)
    assert await fold(streaks, ep.id, "gone") == "disabled"
    gone = await _endpoint(streaks, ep.id)
    assert not gone.enabled
    assert "410" in gone.disabled_reason

    ratios = store_with(webhook_breaker_ratio=0.6)
    ep = await ratios.create("acme", "https://93.184.216.34/h", [])
    assert await fold(ratios, ep.id, "fail", "ok", "fail", "ok") == "closed"  # 2 of 4
    assert await fold(ratios, ep.id, "fail") == "open"  # 3 of 5 = 0.6, no streak


async def test_a_rotated_tenant_secret_signs_job_webhooks_twice(
    queue: JobQueue,
    settings: Settings,
    start_worker: WorkerFactory,
    start_dispatcher: Callable[[Settings], Dispatcher],
    receivers: ReceiverFactory,
) -> None:
    """After the tenant rotates, a job's webhook_url delivery verifies with the old and the
    new secret."""
    r = await receivers()
    store = WebhookStore(queue)
    old = await store.tenant_secret("acme")
    new = await store.rotate_tenant_secret("acme")
    assert await store.tenant_secrets("acme") == (new, old)
    job_id = (
        await queue.enqueue(
            JobSpec(
                tenant="acme", quality="preview", webhook_url=r.url, webhook_events=(COMPLETED,)
            )
        )
    ).job_id
    await start_worker()
    await wait_for_status(queue, job_id, {"completed"})
    start_dispatcher(dispatcher_settings(settings))

    await r.wait_for_calls(1, timeout_s=15)
    _, headers, body = r.calls[0]
    assert len(headers["webhook-signature"].split(" ")) == 2
    for secret in (old, new):
        assert standardwebhooks.Webhook(secret).verify(body, headers)["data"]["job_id"] == job_id


async def _dead_letter(queue: JobQueue, event_id: str, tenant: str, target: str) -> None:
    """A message failed for good, recorded as the dispatcher records it."""
    store = WebhookStore(queue)
    message_id = f"{event_id}:{target}"
    fields = {"id": message_id, "event_id": event_id, "event_type": COMPLETED,
              "job_id": "job_000" + "0" * 26, "tenant": tenant, "url": "", "payload": "{}",
              "target": target, "created_ms": "1"}  # fmt: skip
    await store.fan_out(0, [("0-1", [fields])])
    [message] = await store.claim_due(0, 1, 60_000)
    await store.record_many([AttemptResult(message, "failed", 0, {}, "x", code="exhausted")])


async def test_recover_is_bounded_and_touches_only_its_endpoint(queue: JobQueue) -> None:
    store = EndpointStore(
        JobQueue(queue.redis, queue.settings.with_overrides(webhook_recover_limit=2))
    )
    ep = await store.create("acme", "https://93.184.216.34/h", [])
    other = await store.create("acme", "https://93.184.216.34/o", [])
    since_ms = int(time.time() * 1000) - 1000
    for i in range(3):
        await _dead_letter(queue, f"evt_{i}", "acme", ep.id)
    await _dead_letter(queue, "evt_other", "acme", other.id)
    await _dead_letter(queue, "evt_beta", "beta", ep.id)  # same id, another tenant
    first = await store.recover("acme", ep.id, since_ms)
    assert (first.recovered, first.truncated) == (2, True)
    second = await store.recover("acme", ep.id, since_ms)
    assert (second.recovered, second.truncated) == (1, False)
    third = await store.recover("acme", ep.id, since_ms)
    assert (third.recovered, third.truncated) == (0, False)
    left = await queue.redis.xrange(queue.keys.webhook_dead_letters(0))
    assert sorted(f["event_id"] for _, f in left) == ["evt_beta", "evt_other"]
    due = await queue.redis.zrange(queue.keys.webhook_due(0), 0, -1)
    assert sorted(due) == [f"evt_{i}:{ep.id}" for i in range(3)]
    # Nothing failed after `since` is not recovered.
    await _dead_letter(queue, "evt_late", "acme", other.id)
    late = await store.recover("acme", other.id, int(time.time() * 1000) + 1)
    assert late.recovered == 0


@pytest.mark.slow
async def test_dispatchers_killed_mid_run_lose_no_endpoint_message(
    queue: JobQueue,
    redis_server: RedisServer,
    start_worker: WorkerFactory,
    receivers: ReceiverFactory,
) -> None:
    """Two dispatcher processes SIGKILLed while delivering 40 messages to an endpoint: a
    third finishes, and the receiver's dedupe on webhook-id sees every job's event."""
    r = await receivers(*[(200, {}, 0.05)] * 40)
    store = EndpointStore(queue)
    await store.create("acme", r.url, [COMPLETED])
    job_ids = await _completed_jobs(queue, start_worker, 40)
    env = service_env(
        redis_server.url,
        SPLATQ_WEBHOOK_ALLOW_PRIVATE="1",
        SPLATQ_WEBHOOK_TIMEOUT_S="1",
        SPLATQ_WEBHOOK_RETRY_BASE_MS="20",
        SPLATQ_WEBHOOK_RETRY_CAP_MS="200",
    )
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", "splatq.services.cli", "dispatcher"]
        out = subprocess.DEVNULL
        procs.append(subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdout=out, stderr=out))
        return procs[-1]

    try:
        for calls_before_kill in (8, 20):
            victim = start()

            await r.wait_for_calls(calls_before_kill, timeout_s=30)
            victim.send_signal(signal.SIGKILL)
            victim.wait(timeout=10)
        start()

        def seen_jobs() -> set[str]:
            return {orjson.loads(body)["data"]["job_id"] for _, _, body in r.calls}

        async def all_seen() -> bool:
            return seen_jobs() == set(job_ids)

        await eventually(all_seen, timeout=60, interval=0.1)
        ids = [h["webhook-id"] for _, h, _ in r.calls]
        assert len(set(ids)) == 40  # one webhook-id per event, whatever the retries
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)


async def test_a_slow_endpoint_never_holds_the_slots_of_another_on_the_same_host(
    queue: JobQueue,
    settings: Settings,
    start_worker: WorkerFactory,
    start_dispatcher: Callable[[Settings], Dispatcher],
) -> None:
    """Two endpoints on one host (as on a shared webhook SaaS), 16 messages each, the slow
    one answering in 1.5 s: the fast one's messages arrive before the first slow answer, and
    the slow one never has more than its per-endpoint share of attempts in flight. (With
    only a per-host limit, the slow backlog holds the host's connections and this fails.)"""
    slow, fast = TimedReceiver(1.5), TimedReceiver()
    app = web.Application()
    app.router.add_post("/slow", slow.handle)
    app.router.add_post("/fast", fast.handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        store = EndpointStore(queue)
        await store.create("acme", str(server.make_url("/slow")), [COMPLETED])
        await store.create("acme", str(server.make_url("/fast")), [COMPLETED])
        await _completed_jobs(queue, start_worker, 16)
        start_dispatcher(
            dispatcher_settings(
                settings,
                webhook_concurrency=6,
                webhook_concurrency_per_endpoint=2,
                webhook_concurrency_per_host=16,
            )
        )

        async def fast_done() -> bool:
            return len(fast.arrived) >= 16

        await eventually(fast_done, timeout=20)
        # All 16 served before even one slow answer came back to free a slot.
        assert not slow.answered or max(fast.arrived) < min(slow.answered)
        assert slow.most_in_flight <= 2
    finally:
        await server.close()
