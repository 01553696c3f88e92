"""The dispatcher's batch scripts against a real redis-server: wh_claim_due (find and claim a
partition's due messages in one call) and wh_result_batch (record many results in one call).
A resend of either (a lost reply) answers what the first execution did and changes nothing
twice; one message's error in a result batch leaves its batch-mates recorded; a claim whose
dispatcher died is due again after the visibility timeout (at-least-once)."""

from __future__ import annotations

import asyncio
from typing import Any

from redis.asyncio import Redis

from splatq.shared.engine.ids import new_job_id
from splatq.shared.engine.queue import JobQueue
from splatq.shared.engine.scripts import ScriptCall, new_request_id
from splatq.shared.redis.replay import replay_key
from splatq.shared.webhooks.endpoints import EndpointStore
from splatq.shared.webhooks.scripts import WebhookScript
from splatq.shared.webhooks.store import (
    AttemptResult,
    Message,
    Recorded,
    WebhookStore,
    _attempt_json,
)
from tests.fault_fixtures import proxied, proxy, sha
from tests.faultproxy import FaultProxy

__all__ = ["proxied", "proxy"]  # fixtures

COMPLETED = "3d_reconstruction.completed"


async def _messages(queue: JobQueue, n: int, job_ids: list[str] | None = None) -> list[str]:
    """n pending messages in partition 0, as the fan-out creates them; their ids in order."""
    store = WebhookStore(queue)
    jobs = job_ids or [new_job_id(0)] * n
    fields = [
        {"id": f"evt_{i:04d}:job", "event_id": f"evt_{i:04d}", "event_type": COMPLETED,
         "job_id": jobs[i], "tenant": "acme", "url": "https://93.184.216.34/h",
         "payload": f'{{"n":{i}}}', "target": "job", "created_ms": "1"}
        for i in range(n)
    ]  # fmt: skip
    await store.fan_out(0, [("0-1", fields)])
    return [f["id"] for f in fields]


async def _state(redis: Redis, queue: JobQueue, ids: list[str]) -> list[Any]:
    """What a claim or a result may change: each message's hash and due score, and the
    partition's dead letters."""
    out: list[Any] = []
    for mid in ids:
        out.append(await redis.hgetall(queue.keys.webhook_message(0, mid)))  # type: ignore[misc]
        out.append(await redis.zscore(queue.keys.webhook_due(0), mid))
    out.append(await redis.xlen(queue.keys.webhook_dead_letters(0)))
    return out


async def test_a_claim_answers_the_fields_to_send_and_claims_at_most_its_count(
    queue: JobQueue, redis: Redis
) -> None:
    ids = await _messages(queue, 3)
    store = WebhookStore(queue)
    claimed = await store.claim_due(0, 2, 60_000)
    assert [m.id for m in claimed] == ids[:2]
    first = claimed[0]
    assert (first.event_id, first.event_type, first.tenant, first.target) == (
        "evt_0000", COMPLETED, "acme", "job")  # fmt: skip
    assert (first.payload, first.attempts, first.url) == (b'{"n":0}', 1, "https://93.184.216.34/h")
    assert [m.id for m in await store.claim_due(0, 10, 60_000)] == ids[2:]
    assert await store.claim_due(0, 10, 60_000) == []  # all claimed: none due


async def test_a_claim_whose_reply_is_lost_hands_out_the_same_messages_once(
    proxied: JobQueue, proxy: FaultProxy, queue: JobQueue, redis: Redis
) -> None:
    """The claim ran but its reply was lost: the client's resend (same request id) answers
    the same two messages with the same attempt numbers, claims no third one and counts no
    attempt twice."""
    ids = await _messages(queue, 3)
    proxy.lose_reply_after(sha(proxied, WebhookScript.WH_CLAIM_DUE))
    claimed = await WebhookStore(proxied).claim_due(0, 2, 60_000)
    assert proxy.lost_replies == 1
    assert [(m.id, m.attempts) for m in claimed] == [(ids[0], 1), (ids[1], 1)]
    attempts = [await redis.hget(queue.keys.webhook_message(0, i), "attempts") for i in ids]  # type: ignore[misc]
    assert attempts == ["1", "1", "0"]
    [third] = await WebhookStore(queue).claim_due(0, 10, 60_000)
    assert third.id == ids[2]


async def test_a_resent_claim_call_answers_alike_and_changes_nothing(
    queue: JobQueue, redis: Redis
) -> None:
    """The very same call sent twice (one request id): the second answers the first's reply
    from the memo -- even with more messages due meanwhile -- and writes nothing."""
    ids = await _messages(queue, 2)
    store = WebhookStore(queue)
    call = await _claim_call(store, most=5)
    first = await store.scripts.run(call)
    before = await _state(redis, queue, ids)
    more = await _messages(queue, 4)  # 2 more messages (ids 0002, 0003), due now
    again = await store.scripts.run(call)
    assert again == first
    assert len(first) == 2 * 9
    assert await _state(redis, queue, ids) == before
    assert [m.id for m in await store.claim_due(0, 10, 60_000)] == more[2:]


async def _claim_call(store: WebhookStore, most: int) -> ScriptCall:
    """wh_claim_due's call as claim_due makes it: the due candidates read first, their
    hashes declared."""
    request_id = new_request_id()
    due = store.keys.webhook_due(0)
    ids = [str(i) for i in await store.redis.zrangebyscore(due, "-inf", "+inf", 0, most)]
    return ScriptCall(
        WebhookScript.WH_CLAIM_DUE,
        [due, replay_key(due, request_id), *(store.keys.webhook_message(0, i) for i in ids)],
        [60_000, 60_000, *ids],
        request_id,
    )


async def test_a_candidate_claimed_meanwhile_is_left_to_its_claimer(
    queue: JobQueue, redis: Redis
) -> None:
    """Between claim_due's read of the due set and its script, another dispatcher claimed
    the same messages: the late call claims nothing, counts no attempt and keeps them in the
    due set (due again after the other's visibility timeout)."""
    ids = await _messages(queue, 2)
    store = WebhookStore(queue)
    late = await _claim_call(store, most=5)
    assert [m.id for m in await store.claim_due(0, 5, 60_000)] == ids
    before = await _state(redis, queue, ids)
    assert await store.scripts.run(late) == []
    assert await _state(redis, queue, ids) == before
    assert set(await redis.zrange(store.keys.webhook_due(0), 0, -1)) == set(ids)


def _results(messages: list[Message]) -> list[AttemptResult]:
    """A retry, a deferral and a permanent failure: each leaves a mark a second run would
    double (an attempt logged twice, an attempt given back twice, two dead letters)."""
    outcomes = [("retry", 50, "exhausted"), ("deferred", 50, "circuit_open"),
                ("failed", 0, "exhausted")]  # fmt: skip
    return [
        AttemptResult(m, outcome, delay, {"attempt": m.attempts}, "x", code=code)
        for m, (outcome, delay, code) in zip(messages, outcomes, strict=True)
    ]


async def test_a_resent_result_batch_answers_alike_and_records_once(
    queue: JobQueue, redis: Redis
) -> None:
    """One wh_result_batch call sent twice (one request id): the same statuses, and the
    retry, the deferral and the dead letter each happen once."""
    job_id = new_job_id(0)
    ids = await _messages(queue, 3, [job_id] * 3)
    store = WebhookStore(queue)
    claimed = await store.claim_due(0, 3, 60_000)
    call = store._result_call(0, [(r, _attempt_json(r)) for r in _results(claimed)])
    first = await store.scripts.run(call)
    assert first == ["pending", "pending", "failed"]
    after = await _state(redis, queue, ids)
    assert await store.scripts.run(call) == first
    assert await _state(redis, queue, ids) == after
    assert await redis.llen(queue.keys.job_deliveries(job_id)) == 3  # type: ignore[misc]
    assert await redis.hget(queue.keys.webhook_message(0, ids[1]), "attempts") == "0"  # type: ignore[misc]
    assert await redis.xlen(queue.keys.webhook_dead_letters(0)) == 1


async def test_a_result_batch_whose_reply_is_lost_records_once(
    proxied: JobQueue, proxy: FaultProxy, queue: JobQueue, redis: Redis
) -> None:
    """record_many's batch ran but its reply was lost: the resend answers each message's
    status, and nothing is recorded twice."""
    job_id = new_job_id(0)
    await _messages(queue, 3, [job_id] * 3)
    store = WebhookStore(proxied)
    claimed = await store.claim_due(0, 3, 60_000)
    proxy.lose_reply_after(sha(proxied, WebhookScript.WH_RESULT_BATCH))
    recorded = await store.record_many(_results(claimed))
    assert proxy.lost_replies == 1
    assert [r.status for r in recorded if isinstance(r, Recorded)] == [
        "pending", "pending", "failed"]  # fmt: skip
    assert await redis.llen(queue.keys.job_deliveries(job_id)) == 3  # type: ignore[misc]
    assert await redis.xlen(queue.keys.webhook_dead_letters(0)) == 1
    assert await redis.hget(queue.keys.webhook_message(0, claimed[1].id), "attempts") == "0"  # type: ignore[misc]


async def test_an_endpoints_results_whose_reply_is_lost_count_once(
    proxied: JobQueue, proxy: FaultProxy, queue: JobQueue, redis: Redis
) -> None:
    """Three failed attempts to one endpoint: their health outcomes and attempt records go
    in one wh_ep_record.lua call, whose reply is lost. The resend answers from the memo:
    the failure streak is three, not six, and the attempt log holds three entries."""
    ep = await EndpointStore(queue).create("acme", "https://93.184.216.34/h", [])
    fields = [
        {"id": f"evt_{i:04d}:{ep.id}", "event_id": f"evt_{i:04d}", "event_type": COMPLETED,
         "job_id": "", "tenant": "acme", "url": "", "payload": "{}", "target": ep.id,
         "created_ms": "1"}
        for i in range(3)
    ]  # fmt: skip
    await WebhookStore(queue).fan_out(0, [("0-1", fields)])
    store = WebhookStore(proxied)
    claimed = await store.claim_due(0, 3, 60_000)
    results = [AttemptResult(m, "retry", 50, {"attempt": 1}, "503", health="fail")
               for m in claimed]  # fmt: skip
    proxy.lose_reply_after(sha(proxied, WebhookScript.WH_EP_RECORD))
    recorded = await store.record_many(results)
    assert proxy.lost_replies == 1
    assert all(isinstance(r, Recorded) and r.health is not None for r in recorded)
    endpoint = await EndpointStore(queue).get("acme", ep.id)
    assert endpoint is not None
    assert endpoint.consecutive_failures == 3
    assert await redis.xlen(queue.keys.webhook_endpoint_attempts("acme", ep.id)) == 3


async def test_one_message_error_in_a_result_batch_leaves_the_others_recorded(
    queue: JobQueue, redis: Redis
) -> None:
    """The middle message's job delivery log is not a list (WRONGTYPE in its LPUSH): that
    message answers an error and stays claimed (due again after its visibility timeout);
    its batch-mates before and after it are recorded."""
    jobs = [new_job_id(0) for _ in range(3)]
    await _messages(queue, 3, jobs)
    await redis.set(queue.keys.job_deliveries(jobs[1]), "not a list")
    store = WebhookStore(queue)
    claimed = await store.claim_due(0, 3, 60_000)
    results = [AttemptResult(m, "delivered", 0, {"attempt": 1}) for m in claimed]
    recorded = await store.record_many(results)
    assert isinstance(recorded[0], Recorded)
    assert recorded[0].status == "delivered"
    assert isinstance(recorded[1], Exception)
    assert "WRONGTYPE" in str(recorded[1])
    assert isinstance(recorded[2], Recorded)
    assert recorded[2].status == "delivered"
    statuses = [await redis.hget(queue.keys.webhook_message(0, m.id), "status") for m in claimed]  # type: ignore[misc]
    assert statuses == ["delivered", "pending", "delivered"]
    assert await redis.zscore(queue.keys.webhook_due(0), claimed[1].id) is not None


async def test_a_claim_whose_dispatcher_died_is_due_again_after_the_visibility_timeout(
    queue: JobQueue,
) -> None:
    """Claimed, then nothing recorded (the dispatcher died mid-attempt): not claimable while
    its visibility timeout runs, then claimed again with its next attempt number."""
    [mid] = await _messages(queue, 1)
    store = WebhookStore(queue)
    [first] = await store.claim_due(0, 10, 400)
    assert await store.claim_due(0, 10, 400) == []
    await asyncio.sleep(0.5)
    [again] = await store.claim_due(0, 10, 400)
    assert (again.id, again.attempts, again.payload) == (mid, 2, first.payload)
