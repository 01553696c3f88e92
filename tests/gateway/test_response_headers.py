"""Response hygiene over real loopback HTTP on a real Redis: every answer names the server
`splatq` (no Python or aiohttp version) and carries `X-Content-Type-Options: nosniff`, the
app's own and those aiohttp makes before any handler runs; every answer that carries a
secret is `Cache-Control: no-store`; /metrics is behind the admin key on the API port, or
on a metrics port of its own (the API port then answers 404)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestClient

from splatq.shared.redis.server import free_port
from tests.gateway.conftest import ADMIN, AUTH_A, ClientFactory
from tests.gateway.test_api import form, problem

Client = TestClient[Any, Any]


def _hygienic(headers: Any, what: str) -> None:
    assert headers.get("Server") == "splatq", (what, headers.get("Server"))
    assert headers.get("X-Content-Type-Options") == "nosniff", what


async def _raw_exchange(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.read(65536), timeout=10)
    finally:
        writer.close()


async def test_every_answer_names_splatq_and_says_nosniff(client: Client) -> None:
    job = await (await client.post("/v1/jobs", data=form(), headers=AUTH_A)).json()
    for method, path, headers in (
        ("GET", "/healthz", {}),
        ("GET", "/openapi.json", {}),
        ("GET", "/docs", {}),
        ("GET", "/v1/jobs", AUTH_A),
        ("GET", f"/v1/jobs/{job['id']}", AUTH_A),
        ("GET", "/v1/jobs", {}),  # 401 problem
        ("GET", "/nowhere", {}),  # 404 problem
        ("DELETE", "/v1/jobs", AUTH_A),  # 405 problem
        ("GET", "/v1/admin/tenants", ADMIN),
    ):
        resp = await client.request(method, path, headers=headers)
        _hygienic(resp.headers, f"{method} {path} -> {resp.status}")
    # An event stream, prepared by its handler before its first event.
    async with client.get(f"/v1/jobs/{job['id']}/events", headers=AUTH_A) as stream:
        assert stream.status == 200
        _hygienic(stream.headers, "SSE")
    # What aiohttp answers itself, before any handler: a malformed request's 400.
    assert client.port is not None
    raw = await _raw_exchange(client.port, b"GET / HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n")
    head = raw.split(b"\r\n\r\n", 1)[0].decode("latin-1")
    assert head.split("\r\n", 1)[0].endswith(" 400 Bad Request"), head
    assert "\r\nServer: splatq" in head, head
    assert "X-Content-Type-Options: nosniff" in head, head
    assert "Python" not in head, head
    assert "aiohttp" not in head, head


async def test_answers_that_carry_secrets_are_no_store(client: Client) -> None:
    answers = [
        await client.get("/v1/webhook-secret", headers=AUTH_A),
        await client.post("/v1/webhook-secret/rotate", headers=AUTH_A),
    ]
    created = await client.post(
        "/v1/webhook-endpoints", json={"url": "https://hooks.example.com/in"}, headers=AUTH_A
    )
    answers.append(created)
    endpoint_id = (await created.json())["id"]
    answers.append(
        await client.post(f"/v1/webhook-endpoints/{endpoint_id}/rotate-secret", headers=AUTH_A)
    )
    tenant = await client.post("/v1/admin/tenants", json={"tenant": "kappa"}, headers=ADMIN)
    answers.append(tenant)
    answers.append(await client.post("/v1/admin/tenants/kappa/keys", json={}, headers=ADMIN))
    answers.append(await client.get("/v1/admin/tenants/kappa/keys", headers=ADMIN))
    for resp in answers:
        assert resp.status in {200, 201}, await resp.text()
        assert resp.headers.get("Cache-Control") == "no-store", resp.url


async def test_metrics_on_a_port_of_their_own(make_client: ClientFactory) -> None:
    """With SPLATQ_METRICS_PORT the gateway serves /metrics there without a key (what
    Prometheus scrapes), and its API port answers 404 for /metrics even with the admin key."""
    port = free_port()
    client = await make_client(metrics_port=port)
    assert client.server.runner is not None
    await web.TCPSite(client.server.runner, "127.0.0.1", port).start()
    await problem(await client.get("/metrics", headers=ADMIN), 404, "not_found")
    assert (await client.get("/v1/jobs", headers=AUTH_A)).status == 200
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{port}/metrics") as resp:
            assert resp.status == 200
            text = await resp.text()
            _hygienic(resp.headers, "metrics port")
        assert 'splatq_http_requests_total{method="GET",route="/v1/jobs",status="200"}' in text
        for path in ("/v1/jobs", "/v1/admin/tenants", "/openapi.json"):
            async with http.get(f"http://127.0.0.1:{port}{path}", headers=ADMIN) as resp:
                assert resp.status == 404, path
