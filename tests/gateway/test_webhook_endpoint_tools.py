"""Webhook endpoint tools over a real gateway (loopback HTTP), a real Redis, a real dispatcher
and loopback receivers: a test event through the normal durable path, the per-endpoint
attempt log with cursor paging, and custom headers (validated, sent, never overriding the
signature or the framing)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import pytest
import standardwebhooks
from aiohttp.test_utils import TestClient
from redis.asyncio import Redis

from splatq.services.webhook_dispatcher.dispatcher import Dispatcher
from splatq.shared.engine.keys import KeySchema
from splatq.shared.settings import Settings
from splatq.shared.testing import eventually
from tests.gateway.conftest import AUTH_A, AUTH_B, ClientFactory
from tests.gateway.test_api import problem
from tests.webhook_dispatcher.conftest import (  # noqa: F401 - fixtures
    ReceiverFactory,
    dispatcher_settings,
    receivers,
    start_dispatcher,
)

Client = TestClient[Any, Any]
StartDispatcher = Callable[[Settings], Dispatcher]


@pytest.fixture
async def client(make_client: ClientFactory) -> Client:
    return await make_client(webhook_allow_private=True)


async def _create(client: Client, url: str, **extra: Any) -> dict[str, Any]:
    resp = await client.post("/v1/webhook-endpoints", json={"url": url, **extra}, headers=AUTH_A)
    assert resp.status == 201, await resp.text()
    return dict(await resp.json())


async def _attempts(client: Client, endpoint_id: str, query: str = "") -> dict[str, Any]:
    resp = await client.get(f"/v1/webhook-endpoints/{endpoint_id}/attempts{query}", headers=AUTH_A)
    assert resp.status == 200, await resp.text()
    return dict(await resp.json())


async def test_a_test_event_is_delivered_signed_with_the_custom_headers_and_logged(
    client: Client,
    settings: Settings,
    receivers: ReceiverFactory,  # noqa: F811
    start_dispatcher: StartDispatcher,  # noqa: F811
) -> None:
    target, bystander = await receivers(), await receivers()
    endpoint = await _create(client, target.url, headers={"X-Api-Key": "k-123", "X-Route": "splat"})
    await _create(client, bystander.url)  # subscribed to everything: still not addressed
    assert endpoint["headers"] == {"X-Api-Key": "k-123", "X-Route": "splat"}
    start_dispatcher(dispatcher_settings(settings))
    resp = await client.post(f"/v1/webhook-endpoints/{endpoint['id']}/test", headers=AUTH_A)
    assert resp.status == 202, await resp.text()
    sent = await resp.json()
    assert sent["event"] == "webhook.test"
    await target.wait_for_calls(1)
    _, headers, body = target.calls[0]
    payload = standardwebhooks.Webhook(endpoint["secret"]).verify(body, headers)
    assert payload["event"] == "webhook.test"
    assert payload["id"] == sent["event_id"] == headers["webhook-id"]
    assert payload["data"]["endpoint_id"] == endpoint["id"]
    assert headers["X-Api-Key"] == "k-123"
    assert headers["X-Route"] == "splat"
    assert headers["Content-Type"] == "application/json"

    async def logged() -> bool:
        return bool((await _attempts(client, endpoint["id"]))["items"])

    await eventually(logged)
    [attempt] = (await _attempts(client, endpoint["id"]))["items"]
    assert attempt["event"] == "webhook.test"
    assert attempt["event_id"] == sent["event_id"]
    assert attempt["outcome"] == "delivered"
    assert attempt["status_code"] == 200
    assert bystander.calls == []


async def test_attempts_are_paged_newest_first_per_endpoint(
    client: Client,
    settings: Settings,
    receivers: ReceiverFactory,  # noqa: F811
    start_dispatcher: StartDispatcher,  # noqa: F811
) -> None:
    failing = await receivers(default_status=500)
    endpoint = await _create(client, failing.url)
    other = await _create(client, (await receivers()).url)
    start_dispatcher(dispatcher_settings(settings, webhook_max_attempts=5))
    await client.post(f"/v1/webhook-endpoints/{endpoint['id']}/test", headers=AUTH_A)

    async def all_logged() -> bool:
        return len((await _attempts(client, endpoint["id"], "?limit=100"))["items"]) == 5

    await eventually(all_logged, timeout=20)
    seen: list[int] = []
    query = "?limit=2"
    pages = 0
    while True:
        page = await _attempts(client, endpoint["id"], query)
        pages += 1
        seen.extend(a["attempt"] for a in page["items"])
        if page["next_cursor"] is None:
            assert page["next"] is None
            break
        assert page["next"].endswith(f"cursor={page['next_cursor']}")
        query = f"?limit=2&cursor={page['next_cursor']}"
    assert seen == [5, 4, 3, 2, 1]
    assert pages == 3
    assert (await _attempts(client, endpoint["id"], "?cursor=0-0"))["items"] == []
    assert (await _attempts(client, other["id"]))["items"] == []
    for bad in ("?limit=0", "?limit=101", "?cursor=x", "?cursor=99999999999999999999999-0",
                "?colour=red"):  # fmt: skip
        resp = await client.get(
            f"/v1/webhook-endpoints/{endpoint['id']}/attempts{bad}", headers=AUTH_A
        )
        await problem(resp, 400, "invalid_request")
    resp = await client.get(f"/v1/webhook-endpoints/{endpoint['id']}/attempts", headers=AUTH_B)
    await problem(resp, 404, "not_found")


async def test_a_deleted_endpoint_takes_its_attempt_log_with_it(
    client: Client,
    redis: Redis,
    settings: Settings,
    receivers: ReceiverFactory,  # noqa: F811
    start_dispatcher: StartDispatcher,  # noqa: F811
) -> None:
    r = await receivers()
    endpoint = await _create(client, r.url)
    start_dispatcher(dispatcher_settings(settings))
    await client.post(f"/v1/webhook-endpoints/{endpoint['id']}/test", headers=AUTH_A)
    log = KeySchema().webhook_endpoint_attempts("acme", endpoint["id"])

    async def logged() -> bool:
        return bool(await redis.exists(log))

    await eventually(logged)
    assert 0 < await redis.pttl(log) <= settings.job_retention_ms
    resp = await client.delete(f"/v1/webhook-endpoints/{endpoint['id']}", headers=AUTH_A)
    assert resp.status == 204
    assert not await redis.exists(log)


async def test_a_disabled_or_foreign_endpoint_gets_no_test_event(client: Client) -> None:
    endpoint = await _create(client, "http://127.0.0.1:9/hook")
    url = f"/v1/webhook-endpoints/{endpoint['id']}"
    await problem(await client.post(f"{url}/test", headers=AUTH_B), 404, "not_found")
    await client.patch(url, json={"enabled": False}, headers=AUTH_A)
    await problem(await client.post(f"{url}/test", headers=AUTH_A), 409, "endpoint_disabled")


async def test_custom_headers_are_replaced_and_cleared_with_patch(client: Client) -> None:
    endpoint = await _create(client, "http://127.0.0.1:9/hook", headers={"X-A": "1"})
    url = f"/v1/webhook-endpoints/{endpoint['id']}"
    resp = await client.patch(url, json={"headers": {"X-B": "2"}}, headers=AUTH_A)
    assert (await resp.json())["headers"] == {"X-B": "2"}
    resp = await client.patch(url, json={"events": []}, headers=AUTH_A)
    assert (await resp.json())["headers"] == {"X-B": "2"}  # untouched when not named
    resp = await client.patch(url, json={"headers": None}, headers=AUTH_A)
    assert (await resp.json())["headers"] == {}
    assert (await (await client.get(url, headers=AUTH_A)).json())["headers"] == {}


@pytest.mark.parametrize(
    "headers",
    [
        {"Connection": "close"},
        {"Transfer-Encoding": "chunked"},
        {"Host": "evil.example"},
        {"Content-Length": "1"},
        {"Content-Type": "text/plain"},
        {"webhook-signature": "v1,forged"},
        {"Webhook-Id": "evt_forged"},
        {"Proxy-Authorization": "x"},
        {"User-Agent": "me"},
        {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
        {"Bad Name": "x"},
        {"X-A": "line\r\nInjected: yes"},
        {"X-A": "caf\u00e9"},
        {"X-A": 7},
        {"X-A": "1", "x-a": "2"},
        {f"X-{i}": "v" for i in range(21)},
        {"X-A": "v" * 1025},
        {f"X-{i}": "v" * 1000 for i in range(5)},  # over 4 KiB in all
        {"X" * 65: "v"},
        ["X-A", "1"],
    ],
)
async def test_bad_custom_headers_get_400(client: Client, headers: Any) -> None:
    resp = await client.post(
        "/v1/webhook-endpoints",
        json={"url": "http://127.0.0.1:9/hook", "headers": headers},
        headers=AUTH_A,
    )
    await problem(resp, 400, "invalid_request")


def test_stored_headers_read_back_and_unreadable_ones_count_as_none() -> None:
    from splatq.shared.webhooks.headers import decode_headers, encode_headers  # noqa: PLC0415

    assert decode_headers(encode_headers({"X-A": "1"})) == {"X-A": "1"}
    assert encode_headers({}) == ""
    assert decode_headers("not json") == {}
    assert decode_headers(orjson.dumps([1]).decode()) == {}
