"""Cluster fixtures and helpers: a local Redis Cluster (3 primaries + 3 replicas on ports whose
bus port is free too), the environment the whole stack runs with on it, a webhook receiver
that records every delivery, and the small HTTP client the cluster system tests share."""

from __future__ import annotations

import asyncio
import shutil
import sys
from collections import Counter
from collections.abc import AsyncIterator, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from redis.asyncio import Redis

from splatq.shared.engine.ids import partition_of
from splatq.shared.engine.jobs import JobSpec
from splatq.shared.engine.keys import StreamName
from splatq.shared.engine.queue import JobQueue
from splatq.shared.engine.reaper import Reaper
from splatq.shared.redis.client import connect
from splatq.shared.redis.cluster_server import LocalCluster
from splatq.shared.redis.server import free_port
from splatq.shared.testing import eventually, service_env
from tests.gateway.corpus import valid_png
from tests.helpers import REPO_ROOT

needs_redis_cli = pytest.mark.skipif(shutil.which("redis-cli") is None, reason="needs redis-cli")
KEY = "cluster-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
COMPLETED = "3d_reconstruction.completed"


@pytest.fixture
async def redis_cluster(tmp_path: Path) -> AsyncIterator[LocalCluster]:
    """Three primaries, one replica each; failure detected after 1.5 s (a failover takes
    about 2-3 s). Every node is killed at teardown."""
    cluster = LocalCluster(tmp_path / "cluster", primaries=3, replicas=1, node_timeout_ms=1500)
    try:
        await cluster.start()
        yield cluster
    finally:
        await cluster.stop()


@pytest.fixture
async def cluster_client(redis_cluster: LocalCluster) -> AsyncIterator[Redis]:
    client = connect(redis_cluster.url)
    yield client
    await client.aclose()


def stack_env(tmp_path: Path, partitions: int, **overrides: str) -> dict[str, str]:
    """What every service of the stack gets besides SPLATQ_REDIS_URL: a tenant's key, local
    storage, loopback webhooks allowed (the receiver is local) and quick webhook retries."""
    return {
        "SPLATQ_PARTITIONS": str(partitions),
        "SPLATQ_API_KEYS": f"acme:{KEY}",
        "SPLATQ_WEBHOOK_ALLOW_PRIVATE": "1",
        "SPLATQ_WEBHOOK_RETRY_BASE_MS": "50",
        "SPLATQ_WEBHOOK_RETRY_CAP_MS": "300",
        "SPLATQ_WEBHOOK_MAX_ATTEMPTS": "30",
        "SPLATQ_STORAGE_URL": (tmp_path / "objects").as_uri(),
        "SPLATQ_DATA_DIR": str(tmp_path / "data"),
        **overrides,
    }


@dataclass
class Receiver:
    """A local webhook receiver: POST /<who> records (webhook-id, event, job id) per `who`;
    paths listed in `refuse` answer 410 Gone until removed."""

    deliveries: list[tuple[str, str, str, str]] = field(default_factory=list)
    refuse: set[str] = field(default_factory=set)
    server: TestServer | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/{who}", self._hook)
        self.server = TestServer(app, host="127.0.0.1")
        await self.server.start_server()

    async def close(self) -> None:
        if self.server is not None:
            await self.server.close()

    def url(self, who: str) -> str:
        assert self.server is not None
        return str(self.server.make_url(f"/{who}"))

    async def _hook(self, request: web.Request) -> web.Response:
        who = request.match_info["who"]
        if who in self.refuse:
            return web.Response(status=410)
        body = orjson.loads(await request.read())
        self.deliveries.append(
            (who, request.headers["webhook-id"], body["event"], body["data"]["job_id"])
        )
        return web.Response(status=204)

    def counts(self, job_ids: Collection[str] | None = None) -> Counter[tuple[str, str]]:
        """(who, webhook-id) -> how many times it arrived (of these jobs' events only)."""
        return Counter(
            (who, msg_id)
            for who, msg_id, _, job_id in self.deliveries
            if job_ids is None or job_id in job_ids
        )


class Api:
    """The gateway's HTTP API as the tests use it."""

    def __init__(self, http: aiohttp.ClientSession, base: str) -> None:
        self.http = http
        self.base = base

    async def ready(self) -> bool:
        try:
            async with self.http.get(f"{self.base}/readyz") as resp:
                return resp.status == 200
        except aiohttp.ClientError:
            return False

    async def submit(
        self, n: int, webhook_url: str, metadata: dict[str, str] | None = None
    ) -> tuple[int, str]:
        """Submit a distinct image (`n` picks its size); (status, job id or error body). The
        same `n` again is the same submission (single-flight: the same job)."""
        form = aiohttp.FormData()
        image = valid_png(16 + n % 97, 16 + n // 97)
        form.add_field("image", image, filename="x.png", content_type="image/png")
        params = {"quality": "preview", "webhook_url": webhook_url, "metadata": metadata or {}}
        form.add_field("params", orjson.dumps(params).decode(), content_type="application/json")
        async with self.http.post(f"{self.base}/v1/jobs", data=form, headers=AUTH) as resp:
            body = await resp.json()
            return resp.status, str(body["id"]) if resp.status in {200, 202} else str(body)

    async def call(self, method: str, path: str, **kw: Any) -> tuple[int, Any]:
        async with self.http.request(method, f"{self.base}{path}", headers=AUTH, **kw) as resp:
            return resp.status, await resp.json()

    async def download(self, job_id: str, name: str) -> tuple[int, bytes]:
        """GET a job's artifact; (status, body)."""
        url = f"{self.base}/v1/jobs/{job_id}/artifacts/{name}"
        async with self.http.get(url, headers=AUTH) as resp:
            return resp.status, await resp.read()

    async def job(self, job_id: str) -> dict[str, Any]:
        status, body = await self.call("GET", f"/v1/jobs/{job_id}")
        assert status == 200, body
        return dict(body)

    async def statuses(self, job_ids: list[str]) -> Counter[str]:
        """Every job's status (a Redis error answered 503 counts as 'unavailable')."""
        out: Counter[str] = Counter()
        for job_id in job_ids:
            status, body = await self.call("GET", f"/v1/jobs/{job_id}")
            out[body["status"] if status == 200 else "unavailable"] += 1
        return out

    async def sse_events(self, job_id: str) -> list[str]:
        """The job's event types over SSE, until the stream ends (after a terminal event)."""
        kinds = []
        async with self.http.get(f"{self.base}/v1/jobs/{job_id}/events", headers=AUTH) as resp:
            assert resp.status == 200
            async for line in resp.content:
                if line.startswith(b"event: "):
                    kinds.append(line[7:].decode().strip())
        return kinds


async def start_stack(
    spawn_service: Any, spawn_worker: Any, url: str, env: dict[str, str], workers: int = 2
) -> str:
    """A gateway, `workers` workers and a dispatcher as processes; returns the API base."""
    port = free_port()
    api = f"http://127.0.0.1:{port}"
    spawn_service("gateway", url, SPLATQ_GATEWAY_PORT=str(port),
                  SPLATQ_GATEWAY_HOST="127.0.0.1", SPLATQ_PUBLIC_URL=api, **env)  # fmt: skip
    spawn_service("dispatcher", url, **env)
    for _ in range(workers):
        spawn_worker(url, **env)
    return api


async def wait_ready(api: Api) -> None:
    await eventually(api.ready, timeout=60, interval=0.2)


async def splatq_cli(redis_url: str, env: dict[str, str], *args: str) -> tuple[int, str, str]:
    """Run `splatq <args>` against the cluster; (exit code, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "splatq.services.cli", *args,
        cwd=REPO_ROOT, env=service_env(redis_url, **env),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def dead_letter_a_job(queue: JobQueue) -> str:
    """A job whose worker died with its last allowed charge, dead-lettered by the reaper
    (while the rest of the fleet is alive: its clock ticks, so the lapse is no outage)."""
    job_id = (
        await queue.enqueue(JobSpec(tenant="acme", quality="preview", metadata={"order": "dlq"}))
    ).job_id
    p = partition_of(job_id)
    await queue.fleet_tick([p])  # a live fleet: the lapse is a death, not an outage
    [taken] = await queue.take(p, {StreamName.INTERACTIVE: 1}, 1, "dead-worker")
    assert taken.outcome == "started"
    await queue.redis.delete(queue.keys.lease(job_id))
    charge = str(queue.settings.max_deliveries - 1)
    await queue.redis.hset(queue.keys.job(job_id), "delivery_charge", charge)  # type: ignore[misc]
    reaper = Reaper(queue, "reaper", 0.0)

    async def dead() -> bool:
        await queue.fleet_tick([p])  # other workers stay alive and tick the fleet clock
        await reaper.reap_stale_entries(p, StreamName.INTERACTIVE, 5)
        job = await queue.get(job_id)
        return job is not None and job.status == "failed"

    await eventually(dead, timeout=15, interval=0.2)
    return job_id
