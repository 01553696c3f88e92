"""The JSON request shape with a presigned input URL: the worker puts the normalised image in
object storage (moto's S3 server, real HTTP) and names it by a presigned GET, which the fake
vendor fetches before it accepts the prediction."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from prometheus_client import CollectorRegistry

from splatq.services.gpu_worker.handler import GpuJobHandler
from splatq.services.gpu_worker.metrics import GpuMetrics
from splatq.services.gpu_worker.remote.backend import RemoteModel
from splatq.shared.engine.queue import JobQueue
from splatq.shared.settings import Settings
from splatq.shared.storage.s3 import S3Storage
from splatq.shared.storage.store import LocalFileStorage
from splatq.shared.testing import WorkerFactory, wait_for_status
from splatq.shared.vendor.config import VendorConfigError
from splatq.shared.vendor.credentials import Credential
from tests.gpu_worker.conftest import sample_png, stored_spec
from tests.shared.test_storage_s3 import aws_env, moto_endpoint  # noqa: F401 - fixtures
from tests.vendor.conftest import VendorFactory, vendor_config


@pytest.fixture
async def s3_storage(moto_endpoint: str) -> AsyncIterator[S3Storage]:  # noqa: F811
    storage = S3Storage("remote-inputs", "splatq", endpoint_url=moto_endpoint)
    await storage.ensure_bucket()
    yield storage
    await storage.close()


async def test_the_image_goes_as_a_presigned_url(
    fake_vendor: VendorFactory,
    settings: Settings,
    s3_storage: S3Storage,
    queue: JobQueue,
    start_worker: WorkerFactory,
    vendor_token: str,
) -> None:
    """`image_as = "url"` with S3 storage: the create names a presigned URL the vendor can
    fetch (it did: the prediction exists); the job completes."""
    vendor = await fake_vendor(duration_s=0.2)
    config = vendor_config(vendor.url, request={"image_as": "url"})
    s = settings.with_overrides(device="cpu", model="remote")
    model = RemoteModel(s, config, Credential(config.auth), s3_storage, CollectorRegistry())
    handler = GpuJobHandler(s, model, s3_storage, GpuMetrics.create(CollectorRegistry()))
    await handler.startup()
    try:
        await start_worker(handler)
        result = await queue.enqueue(await stored_spec(s3_storage, sample_png(8)))
        job = await wait_for_status(queue, result.job_id, {"completed", "failed"}, timeout=40)
    finally:
        await handler.shutdown()
    assert job.status == "completed", job.error
    assert [p.input_kind for p in vendor.predictions.values()] == ["url"]
    url = vendor.bodies[0]["input"]["image"]
    assert "X-Amz-Signature=" in url
    assert "/intermediates/" in url


def test_a_url_shape_without_presigning_storage_is_refused(
    settings: Settings, storage: LocalFileStorage, vendor_token: str
) -> None:
    """Local files cannot be presigned: the configuration is refused at start."""
    config = vendor_config(request={"image_as": "url"})
    with pytest.raises(VendorConfigError, match="presigns"):
        RemoteModel(settings, config, Credential(config.auth), storage, CollectorRegistry())
