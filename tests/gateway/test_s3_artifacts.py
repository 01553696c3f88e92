"""The gateway over S3 storage (moto's server over HTTP): inputs land in the bucket, and an
artifact request answers 302 to a presigned URL that serves the bytes."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from splatq.services.gateway.app import create_app
from splatq.shared.engine.job_context import JobContext
from splatq.shared.engine.jobs import JobOutcome
from splatq.shared.engine.queue import JobQueue
from splatq.shared.settings import Settings
from splatq.shared.storage.s3 import S3Storage
from splatq.shared.storage.store import artifact_key
from splatq.shared.testing import WorkerFactory, wait_for_status
from tests.gateway.conftest import AUTH_A, KEY_A
from tests.gateway.test_api import form
from tests.shared.test_storage_s3 import aws_env, moto_endpoint  # noqa: F401 - fixtures


@pytest.fixture
async def s3_storage(moto_endpoint: str) -> AsyncIterator[S3Storage]:  # noqa: F811
    storage = S3Storage("gateway-test", "splatq", endpoint_url=moto_endpoint)
    await storage.ensure_bucket()
    yield storage
    await storage.close()


async def test_artifacts_redirect_to_a_presigned_url(
    settings: Settings, s3_storage: S3Storage, queue: JobQueue, start_worker: WorkerFactory
) -> None:
    """Submit → the input is in the bucket; completed → GET artifact is a 302 whose target
    (a presigned S3 URL) returns exactly the stored bytes."""
    app = create_app(
        settings.with_overrides(api_keys={KEY_A: "acme"}, public_url="http://gw.test"),
        storage=s3_storage,
        registry=CollectorRegistry(),
    )
    async with TestClient(TestServer(app)) as client:
        resp = await client.post(
            "/v1/jobs", data=form(params={"quality": "preview"}), headers=AUTH_A
        )
        assert resp.status == 202
        job_id = (await resp.json())["id"]
        job = await queue.get(job_id)
        assert job is not None
        assert await s3_storage.exists(job.input_ref)

        async def write_artifacts(ctx: JobContext) -> JobOutcome:
            for name in ("scene.ply", "scene.splat", "preview.png"):
                await s3_storage.put_bytes(artifact_key(ctx.job.id, name), name.encode() * 10)
            return JobOutcome(artifacts={"splat": "x"})

        await start_worker(write_artifacts)
        await wait_for_status(queue, job_id, {"completed"})
        redirect = await client.get(
            f"/v1/jobs/{job_id}/artifacts/splat", headers=AUTH_A, allow_redirects=False
        )
        assert redirect.status == 302
        target = redirect.headers["Location"]
        assert target.startswith("http")
        assert "Signature" in target
        async with aiohttp.ClientSession() as http, http.get(target) as got:
            assert got.status == 200
            assert await got.read() == b"scene.splat" * 10
