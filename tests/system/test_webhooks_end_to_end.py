"""Webhooks through the whole stack as processes: a gateway, a worker and a dispatcher; a
tenant registers an endpoint and submits a job over HTTP, and both the endpoint and the job's
own webhook_url receive the completed event, signed with their own secrets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import standardwebhooks
from aiohttp import web
from aiohttp.test_utils import TestServer
from redis.asyncio import Redis

from splatq.shared.redis.server import RedisServer, free_port
from splatq.shared.testing import eventually
from tests.gateway.corpus import valid_png
from tests.system.conftest import SpawnService, SpawnWorker

pytestmark = pytest.mark.slow
KEY = "e2e-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
COMPLETED = "3d_reconstruction.completed"


async def test_an_endpoint_and_a_job_webhook_url_get_signed_events(
    redis: Redis,  # flushed: no other test's events reach this tenant's endpoint
    redis_server: RedisServer,
    spawn_service: SpawnService,
    spawn_worker: SpawnWorker,
    tmp_path: Path,
) -> None:
    received: dict[str, list[tuple[dict[str, str], bytes]]] = {"endpoint": [], "job": []}

    async def hook(request: web.Request) -> web.Response:
        received[request.match_info["who"]].append((dict(request.headers), await request.read()))
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/{who}", hook)
    receiver = TestServer(app, host="127.0.0.1")
    await receiver.start_server()
    port = free_port()
    api = f"http://127.0.0.1:{port}"
    common = {"SPLATQ_WEBHOOK_ALLOW_PRIVATE": "1", "SPLATQ_API_KEYS": f"acme:{KEY}",
              "SPLATQ_STORAGE_URL": (tmp_path / "objects").as_uri(),
              "SPLATQ_DATA_DIR": str(tmp_path / "data")}  # fmt: skip
    spawn_service(
        "gateway", redis_server.url, SPLATQ_GATEWAY_PORT=str(port),
        SPLATQ_GATEWAY_HOST="127.0.0.1", SPLATQ_PUBLIC_URL=api, **common,
    )  # fmt: skip
    spawn_service("dispatcher", redis_server.url, **common)
    spawn_worker(redis_server.url, **common)
    try:
        async with aiohttp.ClientSession() as http:

            async def ready() -> bool:
                try:
                    async with http.get(f"{api}/readyz") as resp:
                        return resp.status == 200
                except aiohttp.ClientError:
                    return False

            await eventually(ready, timeout=30, interval=0.1)
            async with http.post(
                f"{api}/v1/webhook-endpoints",
                json={"url": str(receiver.make_url("/endpoint")), "events": [COMPLETED]},
                headers=AUTH,
            ) as resp:
                assert resp.status == 201, await resp.text()
                endpoint: dict[str, Any] = await resp.json()
            form = aiohttp.FormData()
            form.add_field("image", valid_png(24, 24), filename="x.png", content_type="image/png")
            form.add_field(
                "params",
                orjson.dumps(
                    {"quality": "preview", "webhook_url": str(receiver.make_url("/job"))}
                ).decode(),
                content_type="application/json",
            )
            async with http.post(f"{api}/v1/jobs", data=form, headers=AUTH) as resp:
                assert resp.status == 202, await resp.text()
                job_id = (await resp.json())["id"]

            async def both_delivered() -> bool:
                async with http.get(f"{api}/v1/jobs/{job_id}/deliveries", headers=AUTH) as resp:
                    log = (await resp.json())["deliveries"]
                delivered = {d["target"] for d in log if d["outcome"] == "delivered"}
                return delivered >= {"job", endpoint["id"]} and bool(received["endpoint"])

            await eventually(both_delivered, timeout=60, interval=0.2)
            async with http.get(f"{api}/v1/webhook-secret", headers=AUTH) as resp:
                tenant_secret = (await resp.json())["secret"]
            async with http.get(
                f"{api}/v1/webhook-endpoints/{endpoint['id']}", headers=AUTH
            ) as resp:
                health = (await resp.json())["health"]
        [(headers, body)] = received["endpoint"]
        event = standardwebhooks.Webhook(endpoint["secret"]).verify(body, headers)
        assert (event["event"], event["data"]["job_id"]) == (COMPLETED, job_id)
        job_events = [
            standardwebhooks.Webhook(tenant_secret).verify(b, h)["event"]
            for h, b in received["job"]
        ]
        assert COMPLETED in job_events
        assert health["circuit"] == "closed"
        assert health["last_success_at"] is not None
    finally:
        await receiver.close()
