"""The client's listing, `Prefer: wait` and input-by-URL calls against the real gateway over
loopback (and a real local HTTP origin for `image_url`); the retry of a waiting submit
against a small real server that answers 503 first. `splatq jobs` and `splatq submit --url
--wait-s` run as processes against the same in-process gateway."""

from __future__ import annotations

import asyncio
import hashlib
import os
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest

from splatq.shared.client import (
    ApiProblem,
    Job,
    JobPage,
    SplatqClient,
    SyncSplatqClient,
)
from splatq.shared.client.query import list_query, prefer_wait
from splatq.shared.engine.states import JobStatus
from splatq.shared.storage.store import LocalFileStorage, input_key
from splatq.shared.testing import WorkerFactory
from tests.gateway.conftest import KEY_A, KEY_B, ClientFactory
from tests.gateway.test_api import PNG
from tests.gateway.test_client import DONE, FAST, Stub, _url, ok, refuse, stub  # noqa: F401
from tests.gateway.test_image_url import PNG as URL_PNG
from tests.gateway.test_image_url import Origin, origin  # noqa: F401 - the fixture
from tests.helpers import REPO_ROOT


async def _queued(client: SplatqClient, n: int, tag: str) -> list[Job]:
    """`n` distinct jobs that stay queued (no worker), oldest first."""
    return [
        await client.submit(PNG, quality="preview", cache=False, metadata={"tag": tag, "i": i})
        for i in range(n)
    ]


def _newest_first(jobs: list[Job]) -> list[str]:
    """The listing's order: creation time (ms), then id, descending (two jobs made in one
    millisecond are ordered by id, not by when they were submitted)."""
    return [j.id for j in sorted(jobs, key=lambda j: (j.raw["created_at"], j.id), reverse=True)]


# -- listing ------------------------------------------------------------------------------


async def test_list_jobs_filters_and_iter_jobs_follows_the_cursor(
    make_client: ClientFactory,
) -> None:
    gateway = await make_client()  # no worker: every job stays queued until canceled
    now = datetime.now(UTC)
    async with SplatqClient(_url(gateway), KEY_A, retry=FAST) as client:
        jobs = await _queued(client, 5, "list")
        canceled = {(await client.cancel(j.id)).id for j in jobs[:2]}
        first = await client.list_jobs(limit=2)
        everything = [job async for job in client.iter_jobs(limit=2)]
        only_canceled = await client.list_jobs(status=JobStatus.CANCELED)
        either = [j async for j in client.iter_jobs(status=["queued", "canceled"], limit=3)]
        recent = await client.list_jobs(created_since=now - timedelta(hours=1), limit=100)
        future = await client.list_jobs(created_since=now + timedelta(hours=1))
        past = await client.list_jobs(created_until=(now - timedelta(hours=1)).isoformat())
        with pytest.raises(ApiProblem) as refused:
            await client.list_jobs(limit=0)
    async with SplatqClient(_url(gateway), KEY_B, retry=FAST) as other:
        theirs = await other.list_jobs()

    ids = {j.id for j in jobs}
    assert isinstance(first, JobPage)
    assert len(first.items) == 2
    assert first.next_cursor is not None
    assert all(isinstance(j, Job) for j in first.items)
    assert [j.id for j in everything] == _newest_first(jobs)
    assert {j.id for j in only_canceled.items} == canceled
    assert all(j.status is JobStatus.CANCELED for j in only_canceled.items)
    assert {j.id for j in either} == ids
    assert {j.id for j in recent.items} == ids
    assert recent.next_cursor is None
    assert future.items == ()
    assert future.next_cursor is None
    assert past.items == ()
    assert (refused.value.status, refused.value.code) == (400, "invalid_request")
    assert theirs.items == ()  # another key sees none of them


async def test_listing_arguments_the_api_would_refuse_are_refused_before_sending() -> None:
    async with SplatqClient("http://127.0.0.1:9", KEY_A, retry=FAST) as client:
        with pytest.raises(ValueError, match="unknown job status"):
            await client.list_jobs(status="done")
        with pytest.raises(ValueError, match="aware"):
            await client.list_jobs(created_since=datetime(2026, 12, 1))
    when = datetime(2026, 12, 1, 13, 0, tzinfo=UTC) + timedelta(microseconds=5)
    assert list_query("completed,failed", when, "2026-12-02T00:00:00+01:00", 7, "c") == [
        ("status", "completed,failed"),
        ("created_since", "2026-12-01T13:00:00.000005Z"),
        ("created_until", "2026-12-02T00:00:00+01:00"),
        ("limit", "7"),
        ("cursor", "c"),
    ]
    assert prefer_wait(None) == {}
    assert prefer_wait(30) == {"Prefer": "wait=30"}
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="wait_s"):
            prefer_wait(bad)  # type: ignore[arg-type]


# -- Prefer: wait -------------------------------------------------------------------------


async def test_submit_with_wait_s_returns_the_finished_job_or_the_queued_one(
    make_client: ClientFactory, start_worker: WorkerFactory
) -> None:
    gateway = await make_client()
    async with SplatqClient(_url(gateway), KEY_A, retry=FAST) as client:
        # No worker yet: the wait ends after its second and the 202's queued job comes back.
        queued = await client.submit(
            PNG, quality="preview", cache=False, metadata={"w": "short"}, wait_s=1
        )
        assert queued.status is JobStatus.QUEUED
        await client.cancel(queued.id)
        await start_worker()
        done = await client.submit(
            PNG, quality="preview", cache=False, metadata={"sleep_s": 0.1}, wait_s=60
        )
    assert done.status is JobStatus.COMPLETED  # one request: the 200 after the wait
    assert done.finished
    assert done.progress == 1.0


async def test_a_waiting_submit_is_retried_as_the_same_submission(
    stub: tuple[Stub, str],  # noqa: F811 - the fixture
) -> None:
    s, url = stub
    s.answers = [refuse(503, "0"), ok(DONE, 200)]
    async with SplatqClient(url, "k", retry=FAST) as client:
        job = await client.submit(b"png", quality="preview", wait_s=5)
        with pytest.raises(ValueError, match="wait_s"):
            await client.submit(b"png", wait_s=-1)
    assert job.status is JobStatus.COMPLETED
    assert len(s.requests) == 2
    assert {r.headers["Prefer"] for _, r in s.requests} == {"wait=5"}
    assert len({r.headers["Idempotency-Key"] for _, r in s.requests}) == 1


# -- image_url ----------------------------------------------------------------------------


async def test_submit_url_sends_the_url_and_the_gateway_fetches_it(
    make_client: ClientFactory,
    start_worker: WorkerFactory,
    origin: Origin,  # noqa: F811 - the fixture
    storage: LocalFileStorage,
) -> None:
    gateway = await make_client(image_url_allow_private=True)
    await start_worker()
    image_url = origin.url("/image.png")
    async with SplatqClient(_url(gateway), KEY_A, retry=FAST) as client:
        job = await client.run(
            image_url=image_url, quality="preview", cache=False, metadata={"sleep_s": 0.1},
            timeout_s=60,
        )  # fmt: skip
        queued = await client.submit_url(image_url, quality="preview", metadata={"u": 2})
        with pytest.raises(ApiProblem) as unreachable:
            await client.submit_url(origin.url("/missing.png"), quality="preview")
        with pytest.raises(ValueError, match="exactly one"):
            await client.submit(PNG, image_url=image_url)
        with pytest.raises(ValueError, match="exactly one"):
            await client.submit()
    assert job.status is JobStatus.COMPLETED
    assert queued.quality == "preview"
    digest = hashlib.sha256(URL_PNG).hexdigest()
    assert await storage.get_bytes(input_key(digest, "png")) == URL_PNG
    assert (unreachable.value.status, unreachable.value.code) == (422, "image_url_unreachable")


async def test_a_private_image_url_is_refused_with_its_code(
    make_client: ClientFactory,
    origin: Origin,  # noqa: F811 - the fixture
) -> None:
    gateway = await make_client()  # the SSRF guard as in production: loopback refused
    async with SplatqClient(_url(gateway), KEY_A, retry=FAST) as client:
        with pytest.raises(ApiProblem) as refused:
            await client.submit_url(origin.url("/image.png"), quality="preview")
    assert (refused.value.status, refused.value.code) == (422, "image_url_forbidden")


async def test_the_sync_client_lists_waits_and_submits_by_url(
    make_client: ClientFactory,
    start_worker: WorkerFactory,
    origin: Origin,  # noqa: F811 - the fixture
) -> None:
    gateway = await make_client(image_url_allow_private=True)
    await start_worker()

    def use() -> tuple[Job, JobPage, list[Job]]:
        with SyncSplatqClient(_url(gateway), KEY_A, retry=FAST) as client:
            job = client.submit_url(
                origin.url("/image.png"), quality="preview", cache=False, wait_s=60
            )
            client.submit(PNG, quality="preview", cache=False, wait_s=60)
            page = client.list_jobs(status="completed", limit=1)
            every = list(client.iter_jobs(limit=1))
            return job, page, every

    job, page, every = await asyncio.to_thread(use)
    assert job.status is JobStatus.COMPLETED
    assert len(page.items) == 1
    assert page.next_cursor is not None
    assert len(every) == 2
    assert every[-1].id == job.id


# -- the CLI, as a process ---------------------------------------------------------------


async def splatq(url: str, *args: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPLATQ_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "splatq.services.cli", *args, "--api-url", url, "--api-key", KEY_A,
        cwd=REPO_ROOT, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_cli_jobs_lists_filters_and_pages(make_client: ClientFactory) -> None:
    gateway = await make_client()
    url = _url(gateway)
    async with SplatqClient(url, KEY_A, retry=FAST) as client:
        jobs = await _queued(client, 3, "cli")
        await client.cancel(jobs[0].id)

    code, out, err = await splatq(url, "jobs", "--all", "--limit", "2", "--json")
    assert code == 0, err
    doc = orjson.loads(out)
    order = _newest_first(jobs)
    assert [j["id"] for j in doc["items"]] == order
    assert doc["next_cursor"] is None

    code, out, err = await splatq(url, "jobs", "--status", "canceled", "--since", "2020-01-01")
    assert code == 0, err
    header, *rows = out.splitlines()
    assert header.split() == ["ID", "STATUS", "QUALITY", "PROGRESS", "CREATED", "ERROR"]
    assert [r.split()[:2] for r in rows] == [[jobs[0].id, "canceled"]]

    code, out, err = await splatq(url, "jobs", "--limit", "1")
    assert code == 0, err
    assert len(out.splitlines()) == 2  # the header and one job
    cursor = err.split("--cursor ", 1)[1].split()[0]
    code, out, err = await splatq(url, "jobs", "--limit", "1", "--cursor", cursor, "--json")
    assert code == 0, err
    assert [j["id"] for j in orjson.loads(out)["items"]] == [order[1]]

    for bad in (["--status", "done"], ["--since", "yesterday"]):
        code, _, err = await splatq(url, "jobs", *bad)
        assert code == 2, (bad, err)
    code, out, _ = await splatq(url, "jobs", "--limit", "500", "--json")
    assert code == 3
    assert orjson.loads(out)["error"]["code"] == "invalid_request"


async def test_cli_submit_by_url_with_a_gateway_wait(
    make_client: ClientFactory,
    start_worker: WorkerFactory,
    origin: Origin,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    gateway = await make_client(image_url_allow_private=True)
    await start_worker()
    url, image_url = _url(gateway), origin.url("/image.png")
    code, out, err = await splatq(
        url, "submit", "--url", image_url, "--quality", "preview", "--no-cache",
        "--metadata", '{"sleep_s": 0.1}', "--wait-s", "60", "--json",
    )  # fmt: skip
    assert code == 0, err
    job: dict[str, Any] = orjson.loads(out)
    assert job["status"] == "completed"

    image = tmp_path / "in.png"
    image.write_bytes(PNG)
    for args in ([], [str(image), "--url", image_url], ["--url", image_url, "--wait-s", "-1"]):
        code, _, err = await splatq(url, "submit", *args)
        assert code == 2, (args, err)
