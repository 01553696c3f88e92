"""The endpoint gate's peek, sent in the claim's round trip: in every state where the gate
writes nothing it answers exactly what the gate answers and writes nothing itself; where the
gate would take the half-open probe it answers ASK and leaves the endpoint as it was. A
dispatcher uses a peek only for the very (tenant, endpoint) it was taken for, and gates the
rest once claimed; delivering to an endpoint with a closed circuit then costs no gate round
trip after the first claim."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from splatq.services.webhook_dispatcher.dispatcher import Dispatcher
from splatq.shared.engine.queue import JobQueue
from splatq.shared.engine.scripts import ScriptCall
from splatq.shared.settings import Settings
from splatq.shared.testing import finish_or_cancel
from splatq.shared.webhooks.endpoints import ASK, EndpointStore
from splatq.shared.webhooks.store import Message, WebhookStore
from tests.webhook_dispatcher.conftest import ReceiverFactory, dispatcher_settings

COMPLETED = "3d_reconstruction.completed"
FAR = 3_000_000_000_000  # ms: long after the test
PAST = 1_000  # ms: long before it

# Endpoint states (fields set on the endpoint hash) where the gate only reads.
READ_ONLY_STATES: dict[str, dict[str, Any]] = {
    "closed": {},
    "open, cooling down": {"circuit": "open", "open_until_ms": FAR},
    "half-open, probe held": {"circuit": "half_open", "probe_until_ms": FAR},
    "disabled": {"disabled_at_ms": PAST, "disabled_reason": "failing"},
}
# ... and where it would take the half-open probe.
PROBE_STATES: dict[str, dict[str, Any]] = {
    "open, due": {"circuit": "open", "open_until_ms": PAST},
    "half-open, probe lapsed": {"circuit": "half_open", "probe_until_ms": PAST},
}


def _strings(reply: Any) -> list[str]:
    return [x.decode() if isinstance(x, bytes) else str(x) for x in reply]


async def _endpoint_in(
    queue: JobQueue, redis: Redis, fields: dict[str, Any]
) -> tuple[EndpointStore, str, str, dict[str, str]]:
    """A new endpoint of acme with `fields` set on its hash: the store, its id, its key, and
    the hash as it then is."""
    store = EndpointStore(queue)
    ep = await store.create("acme", "https://93.184.216.34/h", [])
    key = queue.keys.webhook_endpoint("acme", ep.id)
    if fields:
        await redis.hset(key, mapping=fields)  # type: ignore[misc]
    return store, ep.id, key, await redis.hgetall(key)  # type: ignore[misc]


@pytest.mark.parametrize("state", sorted(READ_ONLY_STATES))
async def test_a_peek_answers_as_the_gate_where_the_gate_only_reads(
    queue: JobQueue, redis: Redis, state: str
) -> None:
    store, ep_id, key, before = await _endpoint_in(queue, redis, READ_ONLY_STATES[state])
    peeked = await store.scripts.run(store.gate_call("acme", ep_id, peek=True))
    assert await redis.hgetall(key) == before  # type: ignore[misc]
    gated = await store.scripts.run(store.gate_call("acme", ep_id))
    assert _strings(peeked)[:5] == _strings(gated)[:5]
    as_peeked, as_gated = EndpointStore.parse_gate(peeked, 3), EndpointStore.parse_gate(gated, 3)
    assert as_peeked is not None
    assert as_gated is not None
    # The same verdicts and what signing needs; a half-open deferral runs from each call's
    # own clock (`now` + the deferral), so those two may be a few ms apart.
    assert [(g.verdict, g.url, g.secrets, g.reason, dict(g.headers)) for g in as_peeked] == [
        (g.verdict, g.url, g.secrets, g.reason, dict(g.headers)) for g in as_gated
    ]
    for p, g in zip(as_peeked, as_gated, strict=True):
        assert 0 <= g.until_ms - p.until_ms <= 1_000
    assert await redis.hgetall(key) == before  # type: ignore[misc]


@pytest.mark.parametrize("state", sorted(PROBE_STATES))
async def test_a_peek_asks_where_the_gate_would_take_the_probe(
    queue: JobQueue, redis: Redis, state: str
) -> None:
    store, ep_id, key, before = await _endpoint_in(queue, redis, PROBE_STATES[state])
    peeked = await store.scripts.run(store.gate_call("acme", ep_id, peek=True))
    assert _strings(peeked) == [ASK]
    assert EndpointStore.parse_gate(peeked, 2) is None
    assert await redis.hgetall(key) == before  # type: ignore[misc]
    # The gate itself then takes the probe: one message probes, the others wait.
    gated = EndpointStore.parse_gate(await store.scripts.run(store.gate_call("acme", ep_id)), 2)
    assert gated is not None
    assert [g.verdict for g in gated] == ["probe", "defer"]
    fields = await redis.hmget(key, ["circuit", "probe_until_ms"])  # type: ignore[misc]
    assert fields[0] == "half_open"
    assert int(fields[1]) > time.time() * 1000


async def test_a_peek_of_a_deleted_endpoint_answers_gone(queue: JobQueue) -> None:
    store = EndpointStore(queue)
    ep = await store.create("acme", "https://93.184.216.34/h", [])
    await store.delete("acme", ep.id)
    peeked = EndpointStore.parse_gate(
        await store.scripts.run(store.gate_call("acme", ep.id, peek=True)), 2
    )
    assert peeked is not None
    assert [g.verdict for g in peeked] == ["gone", "gone"]


async def test_a_peek_taken_for_another_tenant_is_never_used(
    queue: JobQueue, redis: Redis, settings: Settings
) -> None:
    """Endpoint ids are unique, but the peek is keyed by (tenant, endpoint) all the same: a
    peek of tenant `other`'s hash under the same id (forged here) does not gate acme's
    message, which gets acme's own gate -- its URL and its secret."""
    store = EndpointStore(queue)
    ep = await store.create("acme", "https://93.184.216.34/acme", [])
    forged = queue.keys.webhook_endpoint("other", ep.id)
    await redis.hset(forged, mapping={"url": "https://93.184.216.35/other",  # type: ignore[misc]
                                      "secret": "whsec_b3RoZXI="})  # fmt: skip
    peek = await store.scripts.run(store.gate_call("other", ep.id, peek=True))
    dispatcher = Dispatcher(JobQueue(redis, settings))
    message = Message(f"evt_1:{ep.id}", 0, "evt_1", COMPLETED, "", "acme", "", b"{}", 1, ep.id)
    gates = await dispatcher.gatekeeper.gates([message], {("other", ep.id): peek})
    assert gates[message.id].url == "https://93.184.216.34/acme"
    assert gates[message.id].secrets == (ep.secret,)


async def test_a_failed_peek_or_an_ask_is_gated_after_the_claim(
    queue: JobQueue, redis: Redis, settings: Settings
) -> None:
    """A peek that came back as an error (a slot in migration answers TRYAGAIN) or as
    `ask` answers nothing: the gate itself runs for those messages, and takes the half-open
    probe where one is due (one message probes, its batch-mate waits)."""
    store = EndpointStore(queue)
    ok = await store.create("acme", "https://93.184.216.34/ok", [])
    due = await store.create("acme", "https://93.184.216.34/due", [])
    await redis.hset(queue.keys.webhook_endpoint("acme", due.id),  # type: ignore[misc]
                     mapping=PROBE_STATES["open, due"])  # fmt: skip
    peek_due = await store.scripts.run(store.gate_call("acme", due.id, peek=True))
    assert _strings(peek_due) == [ASK]
    gatekeeper = Dispatcher(JobQueue(redis, settings)).gatekeeper
    messages = [
        Message(f"evt_{i}:{e.id}", 0, f"evt_{i}", COMPLETED, "", "acme", "", b"{}", 1, e.id)
        for i, e in enumerate((ok, due, due))
    ]
    peeks = {("acme", ok.id): ResponseError("TRYAGAIN"), ("acme", due.id): peek_due}
    gates = await gatekeeper.gates(messages, peeks)
    assert [gates[m.id].verdict for m in messages] == ["send", "probe", "defer"]
    assert gates[messages[0].id].url == "https://93.184.216.34/ok"
    state = await redis.hget(queue.keys.webhook_endpoint("acme", due.id), "circuit")  # type: ignore[misc]
    assert state == "half_open"


async def test_a_closed_endpoint_is_gated_in_the_claims_round_trip(
    queue: JobQueue,
    redis: Redis,
    settings: Settings,
    receivers: ReceiverFactory,
) -> None:
    """Twelve messages to one endpoint, claimed two at a time: the first claim gates them
    after claiming (the endpoint's tenant is not known yet), every later one with the peek
    sent beside the claim -- a gate call, in its own round trip, only once -- and every
    message is delivered once, signed with the endpoint's secret."""
    r = await receivers()
    store = EndpointStore(queue)
    ep = await store.create("acme", r.url, [])
    fields = [
        {"id": f"evt_{i:04d}:{ep.id}", "event_id": f"evt_{i:04d}", "event_type": COMPLETED,
         "job_id": "", "tenant": "acme", "url": "", "payload": f'{{"n":{i}}}',
         "target": ep.id, "created_ms": "1"}
        for i in range(12)
    ]  # fmt: skip
    await WebhookStore(queue).fan_out(0, [("0-1", fields)])
    dispatcher = Dispatcher(
        JobQueue(redis, dispatcher_settings(settings, webhook_concurrency=2, partitions=1))
    )
    rounds: list[list[ScriptCall]] = []
    original = dispatcher.queue.scripts._execute

    async def recording(calls: list[ScriptCall]) -> Any:
        rounds.append(list(calls))
        return await original(calls)

    dispatcher.queue.scripts._execute = recording  # type: ignore[method-assign]
    task = asyncio.create_task(dispatcher.run())
    try:
        await r.wait_for_calls(12)
    finally:
        dispatcher.stop()
        await finish_or_cancel(task)
    assert sorted(body for _, _, body in r.calls) == sorted(f["payload"].encode() for f in fields)
    gate_rounds = [c for c in rounds if [x.script.value for x in c] == ["wh_ep_gate"]]
    claims = [c for c in rounds if c and c[0].script.value == "wh_claim_due"]
    peeks = [x for c in claims for x in c[1:] if x.script.value == "wh_ep_gate"]
    assert len(claims) >= 6
    assert len(gate_rounds) == 1
    assert all(x.args[-1] == "1" for x in peeks)
    assert len(peeks) == len(claims) - 1
