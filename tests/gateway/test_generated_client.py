"""A client generated from the live /openapi.json, and nothing else, drives the API (issue #28).

openapi-python-client (the dev extra) generates a package from the document the running
gateway serves, into this test's temporary folder (never into the repository); the test then
uses only that package: it submits the bundled sample image in both encodings (multipart with
`params` as a JSON part, and JSON with a data: URL), follows both jobs to completion while a
real worker (CPU, builtin model) runs them, lists them, downloads an artifact and checks it is
a real PLY, reads the usage, registers a webhook endpoint, reads the event stream (buffered:
see docs/api.md#generated-clients) and lists the tenants with the admin key.
"""

from __future__ import annotations

import base64
import importlib
import io
import subprocess
import sys
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from splatq.services.gpu_worker import formats
from splatq.shared.settings import Settings
from splatq.shared.testing import WorkerFactory, eventually
from tests.gateway.conftest import KEY_A, ClientFactory
from tests.helpers import GpuHandlerFactory

PACKAGE = "splatq_generated_client"
ADMIN_KEY = "admin-key-generated-client-0123456789-abcdefghijkl"
GENERATE_TIMEOUT_S = 120


def _sample_png() -> bytes:
    return (resources.files("splatq.services.gpu_worker") / "samples" / "sample.png").read_bytes()


@pytest.fixture
def unload_generated() -> Iterator[None]:
    """The generated package leaves sys.modules and sys.path after the test."""
    path_before = list(sys.path)
    yield
    sys.path[:] = path_before
    for name in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
        del sys.modules[name]


def generate(spec: bytes, folder: Path) -> Any:
    """openapi-python-client on `spec`; the generated package, imported."""
    (folder / "openapi.json").write_bytes(spec)
    (folder / "config.yaml").write_text("post_hooks: []\n")  # no ruff/formatter run needed
    out = folder / PACKAGE
    done = subprocess.run(
        [sys.executable, "-m", "openapi_python_client", "generate",
         "--path", str(folder / "openapi.json"), "--output-path", str(out),
         "--meta", "none", "--config", str(folder / "config.yaml")],
        capture_output=True, text=True, timeout=GENERATE_TIMEOUT_S, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    # A warning means a piece of the API was left out of the client: none may be.
    assert "Warning" not in done.stdout + done.stderr, done.stdout + done.stderr
    sys.path.insert(0, str(folder))
    return importlib.import_module(PACKAGE)


def _mod(name: str) -> Any:
    return importlib.import_module(f"{PACKAGE}.{name}")


async def test_a_generated_client_submits_follows_lists_and_downloads(
    make_client: ClientFactory,
    settings: Settings,
    start_worker: WorkerFactory,
    gpu_handler_factory: GpuHandlerFactory,
    tmp_path: Path,
    unload_generated: None,
) -> None:
    gateway: TestClient[Any, Any] = await make_client(admin_api_key=ADMIN_KEY)
    spec = await (await gateway.get("/openapi.json")).read()
    pkg = generate(spec, tmp_path)
    base_url = str(gateway.make_url("")).rstrip("/")
    client = pkg.AuthenticatedClient(base_url=base_url, token=KEY_A)
    models, types = _mod("models"), _mod("types")
    submit = _mod("api.jobs.submit_job")
    sample = _sample_png()

    # Multipart: the image as a file part, the params as a JSON part.
    form = models.SubmitJobForm(
        image=types.File(payload=io.BytesIO(sample), file_name="sample.png", mime_type="image/png"),
        params=models.JobParams(
            quality=models.Quality.PREVIEW,
            metadata=models.JobParamsMetadataType0.from_dict({"order": "A-1"}),
        ),
    )
    by_form = await submit.asyncio_detailed(client=client, body=form)
    assert by_form.status_code == 202, by_form.content
    form_job = by_form.parsed
    assert isinstance(form_job, models.Job)
    assert form_job.quality == models.Quality.PREVIEW
    assert form_job.metadata.to_dict() == {"order": "A-1"}

    # JSON: the same image as a data: URL (cache off: a job of its own, not the first one).
    data_url = "data:image/png;base64," + base64.b64encode(sample).decode()
    body = models.SubmitJobJson(image=data_url, quality=models.Quality.PREVIEW, cache=False)
    by_json = await submit.asyncio_detailed(client=client, body=body, idempotency_key="gen-1")
    assert by_json.status_code == 202, by_json.content
    json_job = by_json.parsed
    assert isinstance(json_job, models.Job)
    assert json_job.id != form_job.id
    assert json_job.current_stage is None  # nullable enum: one PipelineStage class, or None

    handler = await gpu_handler_factory(settings)
    await start_worker(handler)
    get_job = _mod("api.jobs.get_job")
    finished: dict[str, Any] = {}

    async def both_completed() -> bool:
        for job_id in (form_job.id, json_job.id):
            job = await get_job.asyncio(job_id=job_id, client=client)
            assert isinstance(job, models.Job), job
            assert job.status != models.JobStatus.FAILED, job.error
            finished[job_id] = job
        return all(j.status == models.JobStatus.COMPLETED for j in finished.values())

    await eventually(both_completed, timeout=120, interval=0.2)
    done = finished[form_job.id]
    assert isinstance(done.current_stage, models.PipelineStage | type(None))
    assert isinstance(done.artifacts, models.ArtifactUrls)

    page = await _mod("api.jobs.list_jobs").asyncio(
        client=client, status=[models.JobStatus.COMPLETED], limit=10
    )
    assert isinstance(page, models.JobPage)
    assert {form_job.id, json_job.id} <= {j.id for j in page.items}

    artifact = await _mod("api.jobs.get_artifact").asyncio_detailed(
        job_id=form_job.id, name=models.GetArtifactName.GAUSSIAN_PLY, client=client
    )
    assert artifact.status_code == 200
    assert formats.verify_ply(artifact.content).count > 0

    usage = await _mod("api.usage.get_usage").asyncio(client=client)
    assert isinstance(usage, models.Usage)
    assert usage.tenant == "acme"

    endpoint_body = models.CreateWebhookEndpointBody(
        url="https://hooks.example.com/splatq", events=[models.EventName.COMPLETED]
    )
    created = await _mod("api.webhook_endpoints.create_webhook_endpoint").asyncio_detailed(
        client=client, body=endpoint_body
    )
    assert created.status_code == 201, created.content
    assert isinstance(created.parsed, models.WebhookEndpoint)
    assert created.parsed.secret.startswith("whsec_")

    # The event stream, read whole (a generated client buffers it; see docs/api.md).
    stream = await _mod("api.events.job_events").asyncio_detailed(job_id=form_job.id, client=client)
    assert stream.status_code == 200
    assert b"event: 3d_reconstruction.completed" in stream.content

    # A problem is parsed as one, whatever its code.
    missing = await get_job.asyncio(job_id="job_000" + "0" * 26, client=client)
    assert isinstance(missing, models.Problem)
    assert missing.code == "not_found"

    admin = pkg.AuthenticatedClient(base_url=base_url, token=ADMIN_KEY)
    tenants = await _mod("api.admin.admin_list_tenants").asyncio(client=admin, limit=50)
    assert {"acme", "beta"} <= {t.tenant for t in tenants.tenants}
    await client.get_async_httpx_client().aclose()
    await admin.get_async_httpx_client().aclose()
