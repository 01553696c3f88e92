"""`/v1/webhook-endpoints` over real HTTP: register, list, show, change, delete, rotate,
recover; every refusal with its code and nothing left behind; tenants isolated (404)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

from aiohttp.test_utils import TestClient
from redis.asyncio import Redis

from splatq.shared.engine.queue import JobQueue
from tests.gateway.conftest import AUTH_A, AUTH_B, ClientFactory

BASE = "/v1/webhook-endpoints"
PUBLIC_URL = "https://93.184.216.34/hooks"  # a public address literal: no DNS lookup
COMPLETED = "3d_reconstruction.completed"


async def _create(client: TestClient[Any, Any], **body: Any) -> dict[str, Any]:
    resp = await client.post(BASE, json={"url": PUBLIC_URL, **body}, headers=AUTH_A)
    assert resp.status == 201, await resp.text()
    return dict(await resp.json())


async def _problem(resp: Any, status: int, code: str) -> dict[str, Any]:
    assert resp.status == status, await resp.text()
    assert resp.headers["Content-Type"].startswith("application/problem+json")
    body = dict(await resp.json())
    assert body["code"] == code, body
    return body


async def test_create_list_show_and_delete(client: TestClient[Any, Any]) -> None:
    created = await _create(client, events=[COMPLETED, COMPLETED])
    assert created["id"].startswith("ep_")
    assert created["secret"].startswith("whsec_")
    assert created["events"] == [COMPLETED]
    assert created["enabled"] is True
    assert created["health"]["circuit"] == "closed"
    listed = await (await client.get(BASE, headers=AUTH_A)).json()
    assert [e["id"] for e in listed["data"]] == [created["id"]]
    assert "secret" not in listed["data"][0]
    shown = await client.get(f"{BASE}/{created['id']}", headers=AUTH_A)
    assert shown.status == 200
    assert (await shown.json())["url"] == PUBLIC_URL
    assert (await client.delete(f"{BASE}/{created['id']}", headers=AUTH_A)).status == 204
    await _problem(await client.get(f"{BASE}/{created['id']}", headers=AUTH_A), 404, "not_found")
    await _problem(await client.delete(f"{BASE}/{created['id']}", headers=AUTH_A), 404, "not_found")
    assert (await (await client.get(BASE, headers=AUTH_A)).json())["data"] == []


async def test_no_events_means_every_event(client: TestClient[Any, Any]) -> None:
    assert (await _create(client))["events"] == []


async def test_another_tenants_endpoint_is_404_for_every_verb(
    client: TestClient[Any, Any],
) -> None:
    ep = await _create(client)
    url = f"{BASE}/{ep['id']}"
    await _problem(await client.get(url, headers=AUTH_B), 404, "not_found")
    await _problem(
        await client.patch(url, json={"enabled": False}, headers=AUTH_B), 404, "not_found"
    )
    await _problem(await client.post(f"{url}/rotate-secret", headers=AUTH_B), 404, "not_found")
    since = {"since": "2026-01-01T00:00:00Z"}
    await _problem(
        await client.post(f"{url}/recover", json=since, headers=AUTH_B), 404, "not_found"
    )
    await _problem(await client.delete(url, headers=AUTH_B), 404, "not_found")
    assert (await (await client.get(BASE, headers=AUTH_B)).json())["data"] == []
    assert (await client.get(url, headers=AUTH_A)).status == 200
    await _problem(await client.get(BASE), 401, "unauthorized")


async def test_bad_registrations_are_refused_and_store_nothing(
    client: TestClient[Any, Any], redis: Redis, queue: JobQueue
) -> None:
    cases: list[tuple[dict[str, Any], int, str]] = [
        ({"json": {}}, 400, "invalid_request"),  # no url
        ({"json": {"url": "http://127.0.0.1:9/x"}}, 400, "invalid_request"),  # SSRF guard
        ({"json": {"url": "https://169.254.169.254/latest"}}, 400, "invalid_request"),
        ({"json": {"url": "http://93.184.216.34/x"}}, 400, "invalid_request"),  # not https
        ({"json": {"url": "ftp://example.com/x"}}, 400, "invalid_request"),
        ({"json": {"url": 7}}, 400, "invalid_request"),
        ({"json": {"url": PUBLIC_URL, "events": ["nope"]}}, 400, "invalid_request"),
        ({"json": {"url": PUBLIC_URL, "events": "all"}}, 400, "invalid_request"),
        ({"json": {"url": PUBLIC_URL, "secret": "mine"}}, 400, "invalid_request"),
        ({"json": [PUBLIC_URL]}, 400, "invalid_request"),
        ({"data": b"{not json", "headers": {"Content-Type": "application/json"}}, 400,
         "invalid_request"),
        ({"data": b"url=x", "headers": {"Content-Type": "text/plain"}}, 415,
         "unsupported_media_type"),
        ({"json": {"url": PUBLIC_URL, "events": ["x" * 20_000]}}, 413, "payload_too_large"),
    ]  # fmt: skip
    for kwargs, status, code in cases:
        headers = {**AUTH_A, **kwargs.pop("headers", {})}
        body = await _problem(await client.post(BASE, headers=headers, **kwargs), status, code)
        assert body["detail"]
    assert await redis.hlen(queue.keys.webhook_endpoints("acme")) == 0
    assert [k async for k in redis.scan_iter(match="*{wh:acme}*")] == []


async def test_the_per_tenant_limit_answers_409(make_client: ClientFactory) -> None:
    client = await make_client(webhook_max_endpoints=2)
    await _create(client)
    await _create(client)
    await _problem(
        await client.post(BASE, json={"url": PUBLIC_URL}, headers=AUTH_A),
        409,
        "endpoint_limit_reached",
    )
    assert len((await (await client.get(BASE, headers=AUTH_A)).json())["data"]) == 2


async def test_patch_changes_url_events_and_enabled(client: TestClient[Any, Any]) -> None:
    ep = await _create(client)
    url = f"{BASE}/{ep['id']}"
    resp = await client.patch(
        url, json={"url": "https://93.184.216.35/v2", "events": [COMPLETED]}, headers=AUTH_A
    )
    assert resp.status == 200
    body = await resp.json()
    assert (body["url"], body["events"]) == ("https://93.184.216.35/v2", [COMPLETED])
    off = await (await client.patch(url, json={"enabled": False}, headers=AUTH_A)).json()
    assert off["enabled"] is False
    assert off["disabled_reason"]
    on = await (await client.patch(url, json={"enabled": True}, headers=AUTH_A)).json()
    assert on["enabled"] is True
    assert on["disabled_at"] is None
    for bad in ({"enabled": "yes"}, {"url": "http://10.0.0.1/"}, {"events": [1]}, {"id": "x"}):
        await _problem(await client.patch(url, json=bad, headers=AUTH_A), 400, "invalid_request")
    after = await (await client.get(url, headers=AUTH_A)).json()
    assert (after["url"], after["events"], after["enabled"]) == (
        "https://93.184.216.35/v2",
        [COMPLETED],
        True,
    )


async def test_rotate_secret_returns_a_new_secret_and_the_overlap(
    client: TestClient[Any, Any],
) -> None:
    ep = await _create(client)
    resp = await client.post(f"{BASE}/{ep['id']}/rotate-secret", headers=AUTH_A)
    assert resp.status == 200
    body = await resp.json()
    assert body["secret"].startswith("whsec_")
    assert body["secret"] != ep["secret"]
    expires = datetime.fromisoformat(body["previous_secret_expires_at"].replace("Z", "+00:00"))
    left = expires - datetime.now(UTC)
    assert timedelta(hours=23, minutes=59) < left <= timedelta(hours=24)


async def test_recover_validates_and_refuses_a_disabled_endpoint(
    client: TestClient[Any, Any],
) -> None:
    ep = await _create(client)
    url = f"{BASE}/{ep['id']}/recover"
    future = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    bad_bodies: list[dict[str, Any]] = [
        {}, {"since": "yesterday"}, {"since": 5}, {"since": future},
        {"since": "2026-01-01T00:00:00"}, {"since": "2026-01-01T00:00:00Z", "n": 1},
    ]  # fmt: skip
    for bad in bad_bodies:
        await _problem(await client.post(url, json=bad, headers=AUTH_A), 400, "invalid_request")
    ok = await client.post(url, json={"since": "2026-01-01T00:00:00Z"}, headers=AUTH_A)
    assert ok.status == 202
    assert (await ok.json())["recovered"] == 0
    await client.patch(f"{BASE}/{ep['id']}", json={"enabled": False}, headers=AUTH_A)
    since = {"since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 60))}
    await _problem(await client.post(url, json=since, headers=AUTH_A), 409, "endpoint_disabled")


async def test_the_tenant_secret_rotates_with_an_overlap(client: TestClient[Any, Any]) -> None:
    """POST /v1/webhook-secret/rotate: a new secret at once, the old one signing for 24 h;
    the other tenant's secret is untouched."""
    first = await (await client.get("/v1/webhook-secret", headers=AUTH_A)).json()
    assert first["previous_secret_expires_at"] is None
    other = await (await client.get("/v1/webhook-secret", headers=AUTH_B)).json()
    resp = await client.post("/v1/webhook-secret/rotate", headers=AUTH_A)
    assert resp.status == 200
    rotated = await resp.json()
    assert rotated["secret"].startswith("whsec_")
    assert rotated["secret"] != first["secret"]
    expires = datetime.fromisoformat(rotated["previous_secret_expires_at"].replace("Z", "+00:00"))
    assert timedelta(hours=23, minutes=59) < expires - datetime.now(UTC) <= timedelta(hours=24)
    now = await (await client.get("/v1/webhook-secret", headers=AUTH_A)).json()
    assert now["secret"] == rotated["secret"]
    assert (await (await client.get("/v1/webhook-secret", headers=AUTH_B)).json()) == other
    await _problem(await client.post("/v1/webhook-secret/rotate"), 401, "unauthorized")
