"""`Prefer: wait=N` on POST /v1/jobs over real loopback HTTP, a real Redis and a real worker:
200 with the finished job when it ends in time (completed or failed), the usual 202 when it
does not, `Preference-Applied` when honoured, and no wait when no SSE slot is free."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from splatq.services.gateway.waiting import MAX_WAIT_S, preferred_wait
from splatq.shared.testing import WorkerFactory
from tests.gateway.conftest import AUTH_A, ClientFactory
from tests.gateway.test_api import form

Client = TestClient[Any, Any]


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ([], None),
        (["wait=5"], 5),
        (["respond-async, wait=12"], 12),
        (["WAIT = 7"], 7),  # names are case-insensitive; BWS around "=" is allowed
        (["wait"], MAX_WAIT_S),
        (["wait=600"], MAX_WAIT_S),
        (['wait="3"'], 3),
        (["wait=-1"], None),
        (["wait=soon"], None),
        (["handling=lenient", "wait=2"], 2),
        (["wait=0"], 0),
    ],
)
def test_the_prefer_header_is_read_as_rfc_7240_says(
    headers: list[str], expected: int | None
) -> None:
    assert preferred_wait(headers) == expected


async def test_a_job_that_ends_in_time_is_answered_with_200(
    client: Client, start_worker: WorkerFactory
) -> None:
    await start_worker()
    resp = await client.post(
        "/v1/jobs",
        data=form(params={"quality": "preview"}),
        headers={**AUTH_A, "Prefer": "wait=600"},
    )
    assert resp.status == 200, await resp.text()
    assert resp.headers["Preference-Applied"] == f"wait={MAX_WAIT_S}"
    job = await resp.json()
    assert job["status"] == "completed"
    assert resp.headers["Location"] == f"/v1/jobs/{job['id']}"


async def test_a_job_that_fails_in_time_is_answered_with_200_and_its_error(
    client: Client, start_worker: WorkerFactory
) -> None:
    await start_worker()
    resp = await client.post(
        "/v1/jobs",
        data=form(params={"quality": "preview", "metadata": {"fail": "permanent"}}),
        headers={**AUTH_A, "Prefer": "wait=30"},
    )
    assert resp.status == 200, await resp.text()
    job = await resp.json()
    assert job["status"] == "failed"
    assert job["error"]["code"] == "INPUT_CORRUPT"


async def test_a_job_still_running_after_the_wait_gets_202(client: Client) -> None:
    resp = await client.post("/v1/jobs", data=form(), headers={**AUTH_A, "Prefer": "wait=1"})
    assert resp.status == 202
    assert resp.headers["Preference-Applied"] == "wait=1"
    assert (await resp.json())["status"] == "queued"


async def test_no_prefer_header_answers_at_once(client: Client) -> None:
    resp = await client.post("/v1/jobs", data=form(), headers=AUTH_A)
    assert resp.status == 202
    assert "Preference-Applied" not in resp.headers


async def test_no_free_stream_slot_means_no_wait(make_client: ClientFactory) -> None:
    client = await make_client(sse_max_streams_per_tenant=1)
    job = await (await client.post("/v1/jobs", data=form(), headers=AUTH_A)).json()
    async with client.get(f"/v1/jobs/{job['id']}/events", headers=AUTH_A) as stream:
        assert stream.status == 200
        await stream.content.readline()  # the stream holds the tenant's only slot
        resp = await asyncio.wait_for(
            client.post(
                "/v1/jobs",
                data=form(image=_other_png()),
                headers={**AUTH_A, "Prefer": "wait=60"},
            ),
            timeout=30,  # a hang would be the bug; the answer comes at once
        )
        assert resp.status == 202
        assert "Preference-Applied" not in resp.headers


def _other_png() -> bytes:
    from tests.gateway import corpus  # noqa: PLC0415

    return corpus.valid_png(20, 20)
