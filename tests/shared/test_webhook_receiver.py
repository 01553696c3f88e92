"""The webhook receiver on a real redis-server: one effect per webhook-id however often it is
replayed, rejections that do not burn ids, and the aiohttp handler over loopback HTTP."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
import warnings
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from redis.asyncio import Redis
from structlog.testing import capture_logs

from splatq.shared.redis.server import RedisServer, free_port
from splatq.shared.webhooks.receiver import (
    AiohttpWebhookHandler,
    Delivery,
    InvalidPayload,
    WebhookReceiver,
    aiohttp_handler,
)
from splatq.shared.webhooks.signing import SignatureError, generate_secret, signed_headers
from tests.helpers import REPO_ROOT

SECRET = generate_secret()
EVENT = "3d_reconstruction.completed"


def delivery(
    msg_id: str = "evt_01", event: str = EVENT, ts: int | None = None, secret: str = SECRET
) -> tuple[dict[str, str], bytes]:
    """Headers and body of one signed delivery attempt, timestamped now unless `ts` is given."""
    body = orjson.dumps(
        {"event": event, "id": msg_id, "timestamp": "2025-01-01T00:00:00Z", "data": {"n": "é"}}
    )
    stamp = int(time.time()) if ts is None else ts
    return signed_headers([secret], msg_id, stamp, body), body


@pytest.fixture
def receiver(redis: Redis) -> WebhookReceiver:
    return WebhookReceiver([SECRET], redis)


async def test_ten_sequential_replays_have_one_effect(receiver: WebhookReceiver) -> None:
    """The same delivery accepted 10 times in a row: one Delivery, then nine Nones."""
    headers, body = delivery()
    results = [await receiver.accept(headers, body) for _ in range(10)]
    assert isinstance(results[0], Delivery)
    assert results[1:] == [None] * 9


async def test_ten_concurrent_replays_have_one_effect(receiver: WebhookReceiver) -> None:
    """10 concurrent accepts of one delivery (asyncio.gather): exactly one Delivery."""
    headers, body = delivery()
    results = await asyncio.gather(*(receiver.accept(headers, body) for _ in range(10)))
    assert sum(isinstance(r, Delivery) for r in results) == 1
    assert sum(r is None for r in results) == 9


async def test_concurrent_replays_through_two_receivers_have_one_effect(redis: Redis) -> None:
    """Two receivers (two replicas) sharing Redis still let one copy through."""
    replicas = [WebhookReceiver([SECRET], redis) for _ in range(2)]
    headers, body = delivery()
    results = await asyncio.gather(*(replicas[i % 2].accept(headers, body) for i in range(10)))
    assert sum(isinstance(r, Delivery) for r in results) == 1


async def test_resigned_retries_of_one_id_are_duplicates(receiver: WebhookReceiver) -> None:
    """Retries carry the same id with a new timestamp and signature: still one effect."""
    now = int(time.time())
    attempts = [delivery(ts=now - 60 + i * 20) for i in range(4)]
    assert len({h["webhook-signature"] for h, _ in attempts}) == 4
    results = [await receiver.accept(h, b) for h, b in attempts]
    assert isinstance(results[0], Delivery)
    assert results[1:] == [None, None, None]


async def test_distinct_ids_are_each_delivered_once(receiver: WebhookReceiver) -> None:
    """Different ids are independent: each is accepted once, replays of each are dropped."""
    deliveries = [delivery(f"evt_{i}") for i in range(5)] * 3
    results = await asyncio.gather(*(receiver.accept(h, b) for h, b in deliveries))
    accepted = sorted(r.id for r in results if r is not None)
    assert accepted == [f"evt_{i}" for i in range(5)]


async def test_delivery_carries_id_timestamp_event_and_parsed_payload(
    receiver: WebhookReceiver,
) -> None:
    """The Delivery has the header id and timestamp, the payload's event and the parsed JSON."""
    headers, body = delivery("evt_fields", ts=int(time.time()) - 7)
    got = await receiver.accept(headers, body)
    assert got == Delivery(
        id="evt_fields",
        timestamp=int(headers["webhook-timestamp"]),
        event=EVENT,
        payload=orjson.loads(body),
    )


async def test_event_is_empty_when_the_payload_has_none(receiver: WebhookReceiver) -> None:
    """A JSON payload without a string `event` (or not an object) gives event ''."""
    for i, payload in enumerate([b"[1,2]", b'{"event":7}', b'"text"', b"null"]):
        headers = signed_headers([SECRET], f"evt_noevent{i}", int(time.time()), payload)
        got = await receiver.accept(headers, payload)
        assert got is not None
        assert (got.event, got.payload) == ("", orjson.loads(payload))


async def test_a_bad_signature_raises_and_does_not_burn_the_id(
    receiver: WebhookReceiver, redis: Redis
) -> None:
    """A forged delivery raises SignatureError without marking its id seen; the real one lands."""
    headers, body = delivery("evt_forged")
    forged_body = body.replace(b"completed", b"completeD")
    for _ in range(3):
        with pytest.raises(SignatureError) as info:
            await receiver.accept(headers, forged_body)
        assert info.value.code == "no_matching_signature"
    assert await redis.exists(receiver.seen_key("evt_forged")) == 0
    assert await receiver.accept(headers, body) is not None


async def test_signature_errors_pass_through_with_their_codes(receiver: WebhookReceiver) -> None:
    """Missing headers, a stale timestamp or a wrong secret raise SignatureError with its code."""
    headers, body = delivery("evt_codes")
    cases = {
        "missing_headers": ({k: v for k, v in headers.items() if k != "webhook-id"}, body),
        "bad_timestamp": ({**headers, "webhook-timestamp": "soon"}, body),
        "timestamp_out_of_tolerance": delivery("evt_codes", ts=int(time.time()) - 3600),
        "no_matching_signature": delivery("evt_codes", secret=generate_secret()),
    }
    for code, (h, b) in cases.items():
        with pytest.raises(SignatureError) as info:
            await receiver.accept(h, b)
        assert info.value.code == code


async def test_a_signed_non_json_body_is_invalid_payload_and_not_burned(
    receiver: WebhookReceiver, redis: Redis
) -> None:
    """A correctly signed body that is not JSON raises InvalidPayload; the id stays unseen."""
    for body in (b"", b"{not json", b"\xff"):
        headers = signed_headers([SECRET], "evt_notjson", int(time.time()), body)
        with pytest.raises(InvalidPayload):
            await receiver.accept(headers, body)
    assert await redis.exists(receiver.seen_key("evt_notjson")) == 0


async def test_seen_ids_expire_after_the_dedupe_ttl(redis: Redis) -> None:
    """The seen marker is one key under key_prefix with the configured TTL."""
    receiver = WebhookReceiver([SECRET], redis, dedupe_ttl_s=900, key_prefix="test:seen:")
    headers, body = delivery("evt_ttl")
    await receiver.accept(headers, body)
    assert await redis.keys("test:seen:*") == ["test:seen:evt_ttl"]
    assert 895 <= await redis.ttl("test:seen:evt_ttl") <= 900


async def test_an_expired_marker_lets_the_id_through_again(receiver: WebhookReceiver) -> None:
    """Dedupe is bounded by the TTL: once the marker is gone the id is new again."""
    headers, body = delivery("evt_expire")
    assert await receiver.accept(headers, body) is not None
    await receiver.redis.delete(receiver.seen_key("evt_expire"))
    assert await receiver.accept(headers, body) is not None


async def test_a_receiver_with_old_and_new_secrets_accepts_either(redis: Redis) -> None:
    """During rotation a receiver holding both secrets accepts deliveries signed by either."""
    old, new = generate_secret(), generate_secret()
    receiver = WebhookReceiver([old, new], redis)
    for i, secret in enumerate((old, new)):
        headers, body = delivery(f"evt_rot{i}", secret=secret)
        assert await receiver.accept(headers, body) is not None


async def test_the_receiver_refuses_bad_configuration(redis: Redis) -> None:
    """No secrets, a malformed secret, a bare string or a TTL under the replay window fail early."""
    with pytest.raises(ValueError, match="at least one"):
        WebhookReceiver([], redis)
    with pytest.raises(ValueError, match="secret"):
        WebhookReceiver([SECRET, "whsec_tooshort"], redis)
    with pytest.raises(TypeError):
        WebhookReceiver(SECRET, redis)
    with pytest.raises(ValueError, match="dedupe_ttl_s"):
        WebhookReceiver([SECRET], redis, dedupe_ttl_s=599)


class Recorder:
    """An on_event that records ids and, until `gate` opens, does not finish."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.finished: list[str] = []
        self.gate = asyncio.Event()

    async def __call__(self, d: Delivery) -> None:
        self.started.append(d.id)
        await self.gate.wait()
        self.finished.append(d.id)


@pytest.fixture
async def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
async def handler(receiver: WebhookReceiver, recorder: Recorder) -> AiohttpWebhookHandler:
    return AiohttpWebhookHandler(receiver, recorder)


@pytest.fixture
async def client(handler: AiohttpWebhookHandler) -> AsyncIterator[TestClient[Any, Any]]:
    app = web.Application()
    app.router.add_post("/webhooks", handler.handle)
    client = TestClient(TestServer(app))
    await client.start_server()
    yield client
    await client.close()
    await handler.drain(timeout_s=5)


async def post(
    client: TestClient[Any, Any], headers: dict[str, str], body: bytes, path: str = "/webhooks"
) -> tuple[int, str, dict[str, Any]]:
    resp = await client.post(path, data=body, headers=headers)
    return resp.status, resp.content_type, orjson.loads(await resp.read())


async def test_aiohttp_handler_is_a_coroutine_handler_with_one_effect_per_id(
    receiver: WebhookReceiver,
) -> None:
    """aiohttp_handler() registers without aiohttp's bare-function warning and dedupes."""
    done: list[str] = []
    finished = asyncio.Event()

    async def on_event(d: Delivery) -> None:
        done.append(d.id)
        finished.set()

    app = web.Application()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        app.router.add_post("/hook", aiohttp_handler(receiver, on_event))
    async with TestClient(TestServer(app)) as client:
        headers, body = delivery("evt_plain")
        answers = await asyncio.gather(*(post(client, headers, body, "/hook") for _ in range(5)))
        assert sorted(a[2]["status"] for a in answers) == ["accepted"] + ["duplicate"] * 4
        await asyncio.wait_for(finished.wait(), timeout=5)
    assert done == ["evt_plain"]


async def test_the_handler_acknowledges_before_on_event_finishes(
    client: TestClient[Any, Any], handler: AiohttpWebhookHandler, recorder: Recorder
) -> None:
    """200 comes back while on_event is still running; it finishes in the background."""
    headers, body = delivery("evt_fast")
    started = time.monotonic()
    status, _, answer = await asyncio.wait_for(post(client, headers, body), timeout=5)
    assert (status, answer) == (200, {"status": "accepted"})
    assert time.monotonic() - started < 2
    assert recorder.finished == []
    assert len(handler.tasks) == 1
    recorder.gate.set()
    await handler.drain(timeout_s=5)
    assert recorder.finished == ["evt_fast"]
    assert handler.tasks == set()


async def test_the_handler_runs_on_event_once_per_unique_id(
    client: TestClient[Any, Any], handler: AiohttpWebhookHandler, recorder: Recorder
) -> None:
    """Replays (sequential and concurrent) all get 200; on_event runs once per webhook-id."""
    recorder.gate.set()
    unique = [delivery(f"evt_http{i}") for i in range(3)]
    for headers, body in unique * 3:
        assert (await post(client, headers, body))[0] == 200
    replays = await asyncio.gather(*(post(client, *unique[0]) for _ in range(10)))
    assert {status for status, _, _ in replays} == {200}
    assert {answer["status"] for _, _, answer in replays} == {"duplicate"}
    await handler.drain(timeout_s=5)
    assert sorted(recorder.finished) == ["evt_http0", "evt_http1", "evt_http2"]


async def test_the_handler_answers_401_problem_json_for_a_tampered_body(
    client: TestClient[Any, Any], handler: AiohttpWebhookHandler, recorder: Recorder
) -> None:
    """A tampered body gets 401 application/problem+json with the code; on_event never runs."""
    headers, body = delivery("evt_tampered")
    status, content_type, problem = await post(client, headers, body + b" ")
    assert (status, content_type) == (401, "application/problem+json")
    assert problem["code"] == "no_matching_signature"
    assert problem["status"] == 401
    assert problem["type"].endswith("/no_matching_signature")
    status, _, problem = await post(client, {"content-type": "application/json"}, body)
    assert (status, problem["code"]) == (401, "missing_headers")
    assert handler.tasks == set()
    assert recorder.started == []
    recorder.gate.set()
    assert (await post(client, headers, body))[0] == 200  # the id was not burned


async def test_the_handler_answers_400_for_a_signed_non_json_body(
    client: TestClient[Any, Any],
) -> None:
    """A correctly signed body that is not JSON gets 400 problem+json `invalid_payload`."""
    headers = signed_headers([SECRET], "evt_text", int(time.time()), b"hello")
    status, content_type, problem = await post(client, headers, b"hello")
    assert (status, content_type, problem["code"]) == (
        400,
        "application/problem+json",
        "invalid_payload",
    )


async def test_a_failing_on_event_is_logged_and_does_not_break_the_handler(
    receiver: WebhookReceiver,
) -> None:
    """An exception in on_event is logged with the id; the next delivery is still handled."""
    seen: list[str] = []

    async def on_event(d: Delivery) -> None:
        seen.append(d.id)
        if d.id == "evt_boom":
            raise RuntimeError("boom")

    handler = AiohttpWebhookHandler(receiver, on_event)
    app = web.Application()
    app.router.add_post("/webhooks", handler.handle)
    async with TestClient(TestServer(app)) as client:
        with capture_logs() as logs:
            assert (await post(client, *delivery("evt_boom")))[0] == 200
            await handler.drain(timeout_s=5)
        assert (await post(client, *delivery("evt_after")))[0] == 200
        await handler.drain(timeout_s=5)
    assert seen == ["evt_boom", "evt_after"]
    failures = [e for e in logs if e["event"] == "webhook.on_event_failed"]
    assert len(failures) == 1
    assert failures[0]["webhook_id"] == "evt_boom"
    assert failures[0]["log_level"] == "error"


async def test_drain_cancels_on_event_tasks_left_at_the_timeout(
    client: TestClient[Any, Any], handler: AiohttpWebhookHandler, recorder: Recorder
) -> None:
    """drain waits up to its timeout, then cancels what is still running."""
    assert (await post(client, *delivery("evt_stuck")))[0] == 200
    await handler.drain(timeout_s=0.05)
    assert handler.tasks == set()
    assert recorder.started == ["evt_stuck"]
    assert recorder.finished == []


async def test_the_example_receiver_prints_each_event_once(
    redis: Redis, redis_server: RedisServer
) -> None:
    """examples/webhook_receiver.py over real HTTP: one line per event, 401 on a bad signature."""
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(REPO_ROOT / "examples" / "webhook_receiver.py"),
        "--port",
        str(port),
        "--redis-url",
        redis_server.url,
        env={**os.environ, "SPLATQ_WEBHOOK_SECRET": SECRET},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    assert proc.stderr is not None
    try:
        line = await asyncio.wait_for(proc.stderr.readline(), timeout=30)
        assert b"listening on" in line, line
        url = f"http://127.0.0.1:{port}/webhooks"
        headers, body = delivery("evt_example")
        async with aiohttp.ClientSession() as session:
            for _ in range(3):
                async with session.post(url, data=body, headers=headers) as resp:
                    assert resp.status == 200
            async with session.post(url, data=body + b"\n", headers=headers) as resp:
                assert resp.status == 401
                assert (await resp.json(content_type=None))["code"] == "no_matching_signature"
        printed = orjson.loads(await asyncio.wait_for(proc.stdout.readline(), timeout=10))
        assert printed == {
            "webhook_id": "evt_example",
            "event": EVENT,
            "payload": orjson.loads(body),
        }
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), timeout=15) == 0
        assert await proc.stdout.read() == b""  # nothing printed for the replays
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
