"""The engine on a real three-node Redis Cluster: every script stays in its slot, so jobs of
all partitions flow through enqueue, take, commit and the outbox unchanged."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from splatq.shared.engine.job_context import JobContext
from splatq.shared.engine.jobs import JobOutcome, JobSpec
from splatq.shared.engine.keys import STREAMS
from splatq.shared.engine.queue import JobQueue
from splatq.shared.engine.worker import Worker
from splatq.shared.redis.client import connect
from splatq.shared.redis.cluster_server import LocalCluster
from splatq.shared.settings import Settings
from splatq.shared.testing import engine_settings, run_burst
from tests.cluster import needs_redis_cli

pytestmark = [pytest.mark.slow, needs_redis_cli]


@pytest.fixture
async def cluster_url(tmp_path: Path) -> AsyncIterator[str]:
    """Three primaries, no replicas (tests/cluster.py has the 3 + 3 one)."""
    cluster = LocalCluster(tmp_path / "cluster", primaries=3, replicas=0)
    try:
        await cluster.start()
        yield cluster.url
    finally:
        await cluster.stop()


async def test_jobs_of_every_partition_complete_on_a_cluster(cluster_url: str) -> None:
    """Three partitions over three nodes: enqueue (with and without claims), take, progress,
    commit and events all work; a repeat of a claimed key returns its job."""
    settings: Settings = engine_settings(cluster_url, partitions=3, worker_concurrency=8)
    redis = connect(cluster_url)
    queue = JobQueue(redis, settings)
    await queue.setup()
    ids = []
    for i in range(24):
        spec = JobSpec(
            tenant="t",
            quality="preview" if i % 2 else "full",
            idempotency_key=f"key-{i}" if i % 3 == 0 else "",
        )
        ids.append((await queue.enqueue(spec)).job_id)
    assert {int(i[4:7]) for i in ids} == {0, 1, 2}
    repeat = await queue.enqueue(JobSpec(tenant="t", idempotency_key="key-0"))
    assert (repeat.created, repeat.job_id) == (False, ids[0])
    # a claim is read in both places it may live in (the key's partition, t's home) at once:
    # one pipeline across two slots
    assert await queue.claim_status("key-0", None, "t") == ("PENDING", ids[0])

    async def handler(ctx: JobContext) -> JobOutcome:
        await ctx.progress(0.5, "half")
        return JobOutcome(artifacts={"result": ctx.job.id})

    # A burst worker: it returns once the queue has drained, so the test polls nothing.
    await run_burst(Worker(queue, settings, handler), timeout_s=30)
    jobs = [await queue.get(i) for i in ids]
    assert all(j is not None and j.status == "completed" for j in jobs)
    for p in range(3):
        for stream in STREAMS:
            assert await redis.xlen(queue.keys.stream(p, stream)) == 0
    completed = 0
    for p in range(3):
        entries = await redis.xrange(queue.keys.events(p))
        completed += sum(1 for _, f in entries if f["type"].endswith(".completed"))
    assert completed == len(ids)
    await redis.aclose()


async def test_jobs_are_listed_across_partitions_on_a_cluster(
    cluster_url: str, tmp_path: Path
) -> None:
    """GET /v1/jobs on a three-node cluster: the per-partition indexes written by enqueue.lua
    (same slot as each job) are merged with single-key reads; every job, newest first."""
    from aiohttp.test_utils import TestClient, TestServer  # noqa: PLC0415
    from prometheus_client import CollectorRegistry  # noqa: PLC0415

    from splatq.services.gateway.app import create_app  # noqa: PLC0415
    from splatq.shared.storage.store import LocalFileStorage  # noqa: PLC0415
    from tests.gateway.corpus import valid_png  # noqa: PLC0415

    settings = engine_settings(
        cluster_url, partitions=6, api_keys={"k": "acme"}, public_url="http://gw.test",
        rate_limit_per_s=1000.0, rate_limit_burst=1000,
    )  # fmt: skip
    app = create_app(settings, LocalFileStorage(tmp_path / "objects"), CollectorRegistry())
    auth = {"Authorization": "Bearer k"}
    async with TestClient(TestServer(app)) as client:
        created = []
        for n in range(8):
            resp = await client.post(
                "/v1/jobs", json={"image": _b64(valid_png(8 + n, 8)), "quality": "preview"},
                headers=auth,
            )  # fmt: skip
            assert resp.status == 202, await resp.text()
            created.append((await resp.json())["id"])
        listed: list[str] = []
        url: str | None = "/v1/jobs?limit=3"
        while url:
            page = await (await client.get(url, headers=auth)).json()
            listed.extend(j["id"] for j in page["items"])
            url = page["next"].removeprefix("http://gw.test") if page["next"] else None
    assert listed == list(reversed(created))


def _b64(data: bytes) -> str:
    import base64  # noqa: PLC0415

    return base64.b64encode(data).decode()
