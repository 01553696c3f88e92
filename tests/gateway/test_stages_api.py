"""A staged job through the HTTP API: submitted to the real gateway over loopback, run by the
real 3DGS stage handlers (one in-process staged worker per stage, the builtin model on CPU,
local storage, the session's redis-server) and read back with `GET /v1/jobs/{id}` and
`GET /v1/jobs/{id}/events` (and `splatq status` as a process): `current_stage`, `stages`
stage by stage (in the job view's own time format, valid against the OpenAPI schema), the
stage progress events in pipeline order ending with `completed`, and a stage that fails (or
is dead-lettered) showing the error."""

from __future__ import annotations

import itertools
from datetime import datetime
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient

from splatq.services.gpu_worker.stages import StageHandlers
from splatq.shared.client import Job
from splatq.shared.engine.stages import ALL_STAGES, PIPELINE
from splatq.shared.testing import StagesFactory, eventually
from tests.gateway.conftest import AUTH_A, ClientFactory
from tests.gateway.test_api import _read_sse, form
from tests.gateway.test_client import _url
from tests.gateway.test_client_api import splatq
from tests.gateway.test_openapi import _check

Client = TestClient[Any, Any]
STAGES = [s.value for s in ALL_STAGES]
LATER = "reconstruct,export,render,publish,cleanup"


async def get_job(client: Client, job_id: str) -> dict[str, Any]:
    resp = await client.get(f"/v1/jobs/{job_id}", headers=AUTH_A)
    assert resp.status == 200, await resp.text()
    doc: dict[str, Any] = await resp.json()
    _check(doc, "Job")
    return doc


async def until(client: Client, job_id: str, ok: Any, timeout_s: float = 60) -> dict[str, Any]:
    """Poll the job view until `ok(view)`; return that view."""
    seen: dict[str, Any] = {}

    async def reached() -> bool:
        seen.update(await get_job(client, job_id))
        return bool(ok(seen))

    await eventually(reached, timeout=timeout_s, interval=0.05)
    return dict(seen)


async def submit(client: Client) -> dict[str, Any]:
    resp = await client.post(
        "/v1/jobs", data=form(params={"quality": "preview", "cache": False}), headers=AUTH_A
    )
    assert resp.status == 202, await resp.text()
    job: dict[str, Any] = await resp.json()
    return job


async def after_ingest(
    client: Client, stage_handlers: StageHandlers, start_stages: StagesFactory
) -> dict[str, Any]:
    """A submitted job run through ingest only: it waits, queued, for reconstruct."""
    job = await submit(client)
    assert job["current_stage"] is None  # no staged worker has taken it yet
    assert job["stages"] == {}
    await start_stages(stage_handlers, "ingest")
    return await until(client, job["id"], lambda j: j["current_stage"] == "reconstruct")


def t(value: str) -> datetime:
    return datetime.fromisoformat(value)


async def test_a_staged_job_reads_stage_by_stage_through_the_job_view(
    make_client: ClientFactory, stage_handlers: StageHandlers, start_stages: StagesFactory
) -> None:
    client = await make_client()
    waiting = await after_ingest(client, stage_handlers, start_stages)
    assert waiting["status"] == "queued"
    assert list(waiting["stages"]) == STAGES
    ingest = waiting["stages"]["ingest"]
    assert ingest["status"] == "succeeded"
    assert ingest["attempts"] == 1
    assert ingest["error"] is None
    assert t(ingest["started_at"]) <= t(ingest["finished_at"])
    # the same RFC 3339 form as the job's own times (`...Z`, milliseconds)
    assert ingest["started_at"].endswith("Z")
    assert waiting["created_at"].endswith("Z")
    assert len(ingest["started_at"]) == len(waiting["created_at"])
    assert waiting["started_at"] == ingest["started_at"]
    assert [waiting["stages"][s]["status"] for s in STAGES[1:]] == ["pending"] * 5
    assert waiting["stages"]["reconstruct"]["attempts"] == 0

    await start_stages(stage_handlers, LATER)
    job = await until(client, waiting["id"], lambda j: j["status"] in {"completed", "failed"})
    assert job["status"] == "completed", job["error"]
    assert job["current_stage"] == "publish"
    stages = job["stages"]
    for name in (s.value for s in PIPELINE):
        assert stages[name]["status"] == "succeeded", name
        assert stages[name]["attempts"] == 1, name
        assert stages[name]["error"] is None
        assert t(stages[name]["started_at"]) <= t(stages[name]["finished_at"]), name
    # one stage after the other, the job starting with the first and ending with the last
    for before, after in itertools.pairwise(PIPELINE):
        assert t(stages[before.value]["finished_at"]) <= t(stages[after.value]["started_at"])
    assert job["started_at"] == stages["ingest"]["started_at"]
    assert job["completed_at"] == stages["publish"]["finished_at"]
    assert stages["ingest"] == ingest  # a finished stage's record does not change

    # cleanup runs after the terminal commit and records itself
    cleaned = await until(
        client, job["id"], lambda j: j["stages"]["cleanup"]["status"] == "succeeded"
    )
    assert cleaned["stages"]["cleanup"]["attempts"] >= 1
    assert t(cleaned["stages"]["cleanup"]["started_at"]) >= t(job["completed_at"])

    # the Python client types the same document
    typed = Job.from_json(cleaned)
    assert typed.current_stage == "publish"
    assert list(typed.stages) == STAGES
    assert all(s.status.value == "succeeded" for s in typed.stages.values())
    assert typed.stages["ingest"].started_at == typed.started_at


async def test_the_event_stream_carries_each_stage_in_order_and_ends_with_completed(
    make_client: ClientFactory, stage_handlers: StageHandlers, start_stages: StagesFactory
) -> None:
    client = await make_client()
    waiting = await after_ingest(client, stage_handlers, start_stages)
    # Connected while the job waits between stages: the stream replays what happened so far
    # and follows the rest live, to its end after the terminal event.
    resp = await client.get(f"/v1/jobs/{waiting['id']}/events", headers=AUTH_A)
    assert resp.status == 200
    await start_stages(stage_handlers, LATER)
    messages = await _read_sse(resp)
    payloads = [orjson.loads(m["data"]) for m in messages]
    kinds = [m["event"].rsplit(".", 1)[1] for m in messages]
    assert kinds == ["queued", "started", *["progress"] * 8, "completed"]
    assert all(p["event"] == m["event"] for p, m in zip(payloads, messages, strict=True))
    progress = [p["data"] for p in payloads if p["event"].endswith(".progress")]
    steps = [(d["stage"], d["stage_status"], d.get("next_stage")) for d in progress]
    assert steps == [
        ("ingest", "succeeded", "reconstruct"),
        ("reconstruct", "running", None),
        ("reconstruct", "succeeded", "export"),
        ("export", "running", None),
        ("export", "succeeded", "render"),
        ("render", "running", None),
        ("render", "succeeded", "publish"),
        ("publish", "running", None),
    ]
    values = [d["progress"] for d in progress]
    assert values == sorted(values)
    assert values[0] > 0
    assert values[-1] < 1
    assert all(d["attempt"] == 1 for d in progress if d["stage_status"] == "running")
    completed = payloads[-1]["data"]
    assert completed["job_id"] == waiting["id"]
    assert set(completed["artifacts"]) == {
        "gaussian_ply",
        "splat",
        "spz",
        "rendered_preview",
        "mask",
    }
    for payload in payloads:
        _check(payload, payload["event"].rsplit(".", 1)[1].capitalize() + "Event")


@pytest.mark.parametrize(
    ("dead_letter_codes", "expected"),
    [(frozenset(), "failed"), (frozenset({"INTERMEDIATE_MISSING"}), "dead_lettered")],
)
async def test_the_stage_a_job_fails_in_shows_why(
    make_client: ClientFactory,
    stage_handlers: StageHandlers,
    start_stages: StagesFactory,
    dead_letter_codes: frozenset[str],
    expected: str,
) -> None:
    """The ingest output is gone before reconstruct runs (retention removed it): reconstruct
    fails with INTERMEDIATE_MISSING, a permanent error, dead-lettered when the deployment's
    SPLATQ_DEAD_LETTER_CODES names it."""
    client = await make_client()
    waiting = await after_ingest(client, stage_handlers, start_stages)
    assert await stage_handlers.store.delete_job(waiting["id"]) >= 1
    await start_stages(stage_handlers, "reconstruct", dead_letter_codes=dead_letter_codes)
    job = await until(client, waiting["id"], lambda j: j["status"] == "failed")
    assert job["current_stage"] == "reconstruct"
    assert job["error"]["code"] == "INTERMEDIATE_MISSING"
    recon = job["stages"]["reconstruct"]
    assert recon["status"] == expected
    assert recon["attempts"] == 1
    assert recon["error"] == job["error"]
    assert recon["finished_at"] == job["completed_at"]
    assert t(recon["started_at"]) <= t(recon["finished_at"])
    assert job["stages"]["ingest"]["status"] == "succeeded"
    assert [job["stages"][s]["status"] for s in STAGES[2:]] == ["pending"] * 4
    assert job["started_at"] == job["stages"]["ingest"]["started_at"]
    code, out, err = await splatq(_url(client), "status", job["id"])
    assert code == 1, err  # the job failed
    rows = [line.split() for line in out.splitlines()[2:]]
    assert rows[1] == ["reconstruct", expected, "1", "INTERMEDIATE_MISSING"]


async def test_splatq_status_prints_the_stages_and_json_includes_them(
    make_client: ClientFactory, stage_handlers: StageHandlers, start_stages: StagesFactory
) -> None:
    client = await make_client()
    url = _url(client)
    unstaged = await submit(client)  # taken by no worker: no stage lines
    code, out, err = await splatq(url, "status", unstaged["id"])
    assert code == 0, err
    assert out.splitlines() == [f"{unstaged['id']} queued 0%"]

    waiting = await after_ingest(client, stage_handlers, start_stages)
    assert waiting["id"] != unstaged["id"]
    code, out, err = await splatq(url, "status", waiting["id"])
    assert code == 0, err
    first, header, *rows = out.splitlines()
    assert first.split()[:2] == [waiting["id"], "queued"]
    assert header.split() == ["STAGE", "STATUS", "ATTEMPTS", "ERROR"]
    assert [r.split() for r in rows] == [
        ["ingest", "succeeded", "1"],
        *([s, "pending", "0"] for s in STAGES[1:]),
    ]
    code, out, err = await splatq(url, "status", waiting["id"], "--json")
    assert code == 0, err
    doc = orjson.loads(out)
    assert doc["current_stage"] == "reconstruct"
    assert doc["stages"] == (await get_job(client, waiting["id"]))["stages"]
