"""Progressive results through the HTTP API: the `progressive` param (validated, stored,
its own cache key), a full progressive job run by the real stage workers (builtin model at
small resolutions, CPU) whose `preview_ready` arrives over SSE before `completed`, once,
with URLs that download valid files through the gateway under the job's own auth
(`?variant=quick`), by hand and with the Python client."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient

from splatq.services.gpu_worker import formats
from splatq.services.gpu_worker.stages import StageHandlers
from splatq.shared.client import Event, SplatqClient
from splatq.shared.engine.events import EventType
from splatq.shared.engine.queue import JobQueue
from splatq.shared.engine.stages import PipelineStage
from splatq.shared.settings import Settings
from splatq.shared.storage.store import ARTIFACT_FILES, LocalFileStorage
from splatq.shared.testing import StagesFactory, eventually
from tests.gateway.conftest import ADMIN, ADMIN_KEY, AUTH_A, AUTH_B, KEY_A, ClientFactory
from tests.gateway.test_api import PNG, _read_sse, form, problem
from tests.gateway.test_client import FAST, _url
from tests.gateway.test_openapi import _check
from tests.pipeline.test_progressive import SMALL, make_stage_handlers

Client = TestClient[Any, Any]
PREVIEW_READY = EventType.PREVIEW_READY.value
COMPLETED = EventType.COMPLETED.value
BASE = "http://gateway.test"


@pytest.fixture
async def stage_handlers(
    settings: Settings, storage: LocalFileStorage
) -> AsyncIterator[StageHandlers]:
    # the worker's links use the gateway's public URL, as in a deployment
    h = make_stage_handlers(settings.with_overrides(public_url=BASE), storage)
    await h.startup(tuple(PipelineStage))
    yield h
    await h.shutdown()


async def submit(client: Client, **params: Any) -> dict[str, Any]:
    resp = await client.post("/v1/jobs", data=form(params=params), headers=AUTH_A)
    assert resp.status == 202, await resp.text()
    job: dict[str, Any] = await resp.json()
    return job


async def view(client: Client, job_id: str) -> dict[str, Any]:
    resp = await client.get(f"/v1/jobs/{job_id}", headers=AUTH_A)
    assert resp.status == 200
    doc: dict[str, Any] = await resp.json()
    return doc


async def until(client: Client, job_id: str, ok: Any) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    async def reached() -> bool:
        seen.update(await view(client, job_id))
        return bool(ok(seen))

    await eventually(reached, timeout=60, interval=0.05)
    return seen


def path_of(url: str) -> str:
    assert url.startswith(BASE + "/v1/jobs/"), url
    return url[len(BASE) :]


@pytest.mark.parametrize("value", ["yes", 1, 0, None, [], {}])
async def test_a_progressive_that_is_not_a_boolean_is_400(client: Client, value: Any) -> None:
    resp = await client.post(
        "/v1/jobs", data=form(params={"quality": "full", "progressive": value}), headers=AUTH_A
    )
    body = await problem(resp, 400, "invalid_request")
    assert "progressive" in body["detail"]
    # the JSON body takes the same params
    resp = await client.post(
        "/v1/jobs",
        data=orjson.dumps({"image": "aGk=", "progressive": value}),
        headers={**AUTH_A, "Content-Type": "application/json"},
    )
    await problem(resp, 400, "invalid_request")


async def test_progressive_is_stored_ignored_on_preview_and_has_its_own_cache_key(
    client: Client, queue: JobQueue
) -> None:
    plain = await submit(client, quality="full")
    progressive = await submit(client, quality="full", progressive=True)
    again = await submit(client, quality="full", progressive=True)
    assert progressive["id"] != plain["id"]  # never joins a job that sends no preview_ready
    assert again["id"] == progressive["id"]  # identical progressive submissions share one
    stored = await queue.get(progressive["id"])
    assert stored is not None
    assert stored.params["progressive"] is True
    plain_stored = await queue.get(plain["id"])
    assert plain_stored is not None
    assert "progressive" not in plain_stored.params
    preview = await submit(client, quality="preview", progressive=True, cache=False)
    preview_stored = await queue.get(preview["id"])
    assert preview_stored is not None
    assert "progressive" not in preview_stored.params  # accepted, and ignored


async def test_the_quick_variant_is_refused_where_there_is_no_quick_result(
    client: Client,
) -> None:
    plain = await submit(client, quality="full", cache=False)
    resp = await client.get(f"/v1/jobs/{plain['id']}/artifacts/splat?variant=quick", headers=AUTH_A)
    await problem(resp, 404, "not_found")
    resp = await client.get(f"/v1/jobs/{plain['id']}/artifacts/splat?variant=draft", headers=AUTH_A)
    body = await problem(resp, 400, "invalid_request")
    assert "variant" in body["detail"]


async def test_a_progressive_job_sends_preview_ready_before_completed_with_downloadable_urls(
    make_client: ClientFactory,
    stage_handlers: StageHandlers,
    start_stages: StagesFactory,
    tmp_path: Path,
) -> None:
    client = await make_client()
    job = await submit(client, quality="full", progressive=True, cache=False)
    job_id = job["id"]
    await start_stages(stage_handlers, "ingest")
    await until(client, job_id, lambda j: j["current_stage"] == "reconstruct")
    # not there before the reconstruct stage has advanced
    resp = await client.get(f"/v1/jobs/{job_id}/artifacts/splat?variant=quick", headers=AUTH_A)
    await problem(resp, 409, "not_ready")

    await start_stages(stage_handlers, "reconstruct,export,render,publish,cleanup")
    resp = await client.get(f"/v1/jobs/{job_id}/events", headers=AUTH_A)
    assert resp.status == 200
    messages = await _read_sse(resp)  # the stream ends after the terminal event
    names = [m["event"] for m in messages]
    assert names.count(PREVIEW_READY) == 1
    assert names[-1] == COMPLETED
    assert names.index(PREVIEW_READY) < names.index(COMPLETED)
    payload = orjson.loads(messages[names.index(PREVIEW_READY)]["data"])
    _check(payload, "Preview_readyEvent")
    artifacts = payload["data"]["artifacts"]
    assert set(artifacts) == set(ARTIFACT_FILES)

    quick: dict[str, bytes] = {}
    for name, url in artifacts.items():
        resp = await client.get(path_of(url), headers=AUTH_A)
        assert resp.status == 200, await resp.text()
        assert f"quick-{ARTIFACT_FILES[name]}" in resp.headers["Content-Disposition"]
        quick[name] = await resp.read()
        # the same auth as the result's artifacts: another tenant's key sees no such job
        other = await client.get(path_of(url), headers=AUTH_B)
        await problem(other, 404, "not_found")
        anonymous = await client.get(path_of(url))
        await problem(anonymous, 401, "unauthorized")
    info = formats.verify_ply(quick["gaussian_ply"])
    formats.verify_splat(quick["splat"], expected_count=info.count)
    formats.verify_png(quick["rendered_preview"], SMALL["preview"], SMALL["preview"])

    done = await view(client, job_id)
    assert done["status"] == "completed"
    full = await client.get(path_of(done["artifacts"]["gaussian_ply"]), headers=AUTH_A)
    assert full.status == 200
    assert formats.verify_ply(await full.read()).count > info.count

    # the Python client downloads both, side by side
    async with SplatqClient(_url(client), KEY_A, retry=FAST) as api:
        saved = await api.download(job_id, "gaussian_ply", tmp_path, variant="quick")
        whole = await api.download(job_id, "gaussian_ply", tmp_path)
    assert saved.name == "quick-scene.ply"
    assert saved.read_bytes() == quick["gaussian_ply"]
    assert whole.name == "scene.ply"
    assert whole.read_bytes() != saved.read_bytes()


async def test_the_client_submits_progressive_and_sees_preview_ready_first(
    make_client: ClientFactory, stage_handlers: StageHandlers, start_stages: StagesFactory
) -> None:
    client = await make_client()
    await start_stages(stage_handlers, "all")
    events: list[Event] = []
    async with SplatqClient(_url(client), KEY_A, retry=FAST) as api:
        job = await api.run(
            PNG, quality="full", progressive=True, cache=False, on_event=events.append,
            timeout_s=60,
        )  # fmt: skip
        plain = await api.run(PNG, quality="full", cache=False, timeout_s=60)
    assert job.status == "completed"
    names = [e.name for e in events]
    assert names.count(PREVIEW_READY) == 1
    assert names.index(PREVIEW_READY) < names.index(COMPLETED)
    resp = await client.get(f"/v1/jobs/{plain.id}/events", headers=AUTH_A)
    assert PREVIEW_READY not in [m["event"] for m in await _read_sse(resp)]


async def test_a_progressive_job_reserves_its_quick_pass_too(make_client: ClientFactory) -> None:
    """The GPU-quota reservation of a progressive full job is the full estimate plus the
    preview one (its quick pass); a plain full job reserves the full estimate."""
    client = await make_client(
        admin_api_key=ADMIN_KEY, quota_estimates_ms={"preview": 4000, "full": 60000}
    )
    resp = await client.put(
        "/v1/admin/tenants/acme/quota", json={"gpu_seconds": 1000}, headers=ADMIN
    )
    assert resp.status == 200, await resp.text()

    async def reserved() -> float:
        usage = await (await client.get("/v1/usage", headers=AUTH_A)).json()
        return float(usage["reserved_gpu_seconds"])

    await submit(client, quality="full", cache=False)
    assert await reserved() == 60
    await submit(client, quality="full", progressive=True, cache=False)
    assert await reserved() == 60 + 64
    await submit(client, quality="preview", progressive=True, cache=False)  # ignored there
    assert await reserved() == 60 + 64 + 4
