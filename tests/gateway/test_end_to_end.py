"""Gateway + GPU worker (CPU) end to end: submit an image over HTTP, follow it, download
and verify its artifacts."""

from __future__ import annotations

from typing import Any

from aiohttp.test_utils import TestClient

from splatq.services.gpu_worker import formats
from splatq.shared.engine.queue import JobQueue
from splatq.shared.settings import Settings
from splatq.shared.testing import WorkerFactory, wait_for_status
from tests.gateway.conftest import AUTH_A, AUTH_B
from tests.gateway.test_api import form, problem
from tests.gpu_worker.conftest import sample_png
from tests.gpu_worker.spz_reader import read_spz
from tests.helpers import GpuHandlerFactory


async def test_submit_follow_and_download_artifacts(
    client: TestClient[Any, Any],
    queue: JobQueue,
    settings: Settings,
    start_worker: WorkerFactory,
    gpu_handler_factory: GpuHandlerFactory,
) -> None:
    """The sample image through the API: 202, completed with artifact URLs on the gateway,
    each artifact downloadable (whole, right type) by its tenant only."""
    handler = await gpu_handler_factory(settings)
    resp = await client.post(
        "/v1/jobs", data=form(sample_png(1), {"quality": "preview"}), headers=AUTH_A
    )
    assert resp.status == 202
    job_id = (await resp.json())["id"]
    await start_worker(handler)
    await wait_for_status(queue, job_id, {"completed"}, timeout=60)
    job = await (await client.get(f"/v1/jobs/{job_id}", headers=AUTH_A)).json()
    assert job["status"] == "completed"
    assert job["progress"] == 1.0
    assert job["model"] == "builtin-silhouette-inflation@1"
    assert isinstance(job["compute_time_ms"], int)
    assert set(job["artifacts"]) == {"gaussian_ply", "splat", "spz", "rendered_preview", "mask"}
    assert job["foreground"] == "alpha"
    ply = await client.get(f"/v1/jobs/{job_id}/artifacts/gaussian_ply", headers=AUTH_A)
    assert ply.status == 200
    count = formats.verify_ply(await ply.read()).count
    splat = await client.get(f"/v1/jobs/{job_id}/artifacts/splat", headers=AUTH_A)
    assert formats.verify_splat(await splat.read(), expected_count=count) == count
    spz = await client.get(f"/v1/jobs/{job_id}/artifacts/spz", headers=AUTH_A)
    assert len(read_spz(await spz.read()).positions) == count  # the independent reader
    png = await client.get(f"/v1/jobs/{job_id}/artifacts/rendered_preview", headers=AUTH_A)
    assert png.content_type == "image/png"
    formats.verify_png(await png.read(), 128, 128)
    await problem(
        await client.get(f"/v1/jobs/{job_id}/artifacts/mesh", headers=AUTH_A), 404, "not_found"
    )
    await problem(
        await client.get(f"/v1/jobs/{job_id}/artifacts/splat", headers=AUTH_B), 404, "not_found"
    )
