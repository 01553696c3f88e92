"""GET /v1/jobs over real loopback HTTP and a real Redis: newest first, per tenant, filters,
cursor paging across partitions (the per-partition index merged), bounded limit, cursors
bound to their filters, and the index written and trimmed by enqueue.lua with the job."""

from __future__ import annotations

import time
from typing import Any

import pytest
from aiohttp import FormData
from aiohttp.test_utils import TestClient
from redis.asyncio import Redis

from splatq.shared.engine.ids import new_job_id, partition_of
from splatq.shared.engine.jobs import JobSpec
from splatq.shared.engine.keys import KeySchema
from splatq.shared.engine.listing import scan_budget
from splatq.shared.engine.queue import JobQueue
from splatq.shared.settings import Settings
from tests.gateway import corpus
from tests.gateway.conftest import AUTH_A, AUTH_B, ClientFactory
from tests.gateway.test_api import problem

Client = TestClient[Any, Any]


def _image(n: int) -> FormData:
    """A distinct image per n (identical images would be coalesced onto one job)."""
    data = FormData()
    data.add_field("image", corpus.valid_png(16 + n, 16), filename="in.png")
    data.add_field("params", '{"quality": "preview"}')
    return data


async def _submit(client: Client, n: int, auth: dict[str, str] = AUTH_A) -> dict[str, Any]:
    resp = await client.post("/v1/jobs", data=_image(n), headers=auth)
    assert resp.status == 202, await resp.text()
    return dict(await resp.json())


async def _all_pages(client: Client, query: str) -> tuple[list[str], int]:
    """Every id over every page of `query`, following `next`; and the page count."""
    ids: list[str] = []
    url: str | None = f"/v1/jobs?{query}"
    pages = 0
    while url is not None:
        resp = await client.get(url, headers=AUTH_A)
        assert resp.status == 200, await resp.text()
        body = await resp.json()
        pages += 1
        ids.extend(j["id"] for j in body["items"])
        if body["next_cursor"] is None:
            assert body["next"] is None
            assert "Link" not in resp.headers
            url = None
        else:
            assert body["next"].startswith("http://gateway.test/v1/jobs?")
            assert resp.headers["Link"] == f'<{body["next"]}>; rel="next"'
            url = body["next"].removeprefix("http://gateway.test")
    return ids, pages


async def test_lists_own_jobs_newest_first_across_partitions(
    make_client: ClientFactory,
) -> None:
    client = await make_client(partitions=4)
    mine = [(await _submit(client, n))["id"] for n in range(9)]
    theirs = [(await _submit(client, n, AUTH_B))["id"] for n in range(3)]
    assert len({partition_of(j) for j in mine}) > 1  # the merge is exercised
    ids, pages = await _all_pages(client, "limit=2")
    assert ids == list(reversed(mine))
    assert pages == 5
    assert not set(ids) & set(theirs)
    one, _ = await _all_pages(client, "limit=100")
    assert one == ids


async def test_status_and_created_filters(client: Client) -> None:
    jobs = [await _submit(client, n) for n in range(5)]
    for j in jobs[1:3]:
        assert (await client.post(f"/v1/jobs/{j['id']}/cancel", headers=AUTH_A)).status == 202
    ids, _ = await _all_pages(client, "status=canceled&limit=1")
    assert ids == [jobs[2]["id"], jobs[1]["id"]]
    ids, _ = await _all_pages(client, "status=queued,canceled")
    assert ids == [j["id"] for j in reversed(jobs)]
    ids, _ = await _all_pages(client, "status=queued&status=completed")
    assert ids == [jobs[4]["id"], jobs[3]["id"], jobs[0]["id"]]
    since = jobs[3]["created_at"]
    ids, _ = await _all_pages(client, f"created_since={since}")
    assert set(ids) >= {jobs[3]["id"], jobs[4]["id"]}
    assert jobs[0]["id"] not in ids or jobs[0]["created_at"] == since
    ids, _ = await _all_pages(client, f"created_until={since}")
    assert jobs[4]["id"] not in ids
    assert jobs[0]["id"] in ids
    ids, _ = await _all_pages(client, "created_since=2000-01-01T00:00:00Z&limit=3")
    assert ids == [j["id"] for j in reversed(jobs)]
    ids, _ = await _all_pages(client, "created_until=2000-01-01T00:00:00Z")
    assert ids == []
    # An offset written with a bare "+" (decoded as a space) still reads as the offset.
    ids, _ = await _all_pages(client, "created_since=2000-01-01T01:00:00+01:00")
    assert len(ids) == 5


async def test_a_tenant_with_no_jobs_gets_an_empty_page(client: Client) -> None:
    await _submit(client, 0)
    resp = await client.get("/v1/jobs", headers=AUTH_B)
    assert resp.status == 200
    assert await resp.json() == {"items": [], "next_cursor": None, "next": None}
    await problem(await client.get("/v1/jobs"), 401, "unauthorized")


@pytest.mark.parametrize(
    "query",
    [
        "limit=0",
        "limit=101",
        "limit=x",
        "status=done",
        "created_since=yesterday",
        "created_since=2024-01-01T00:00:00",  # no time zone
        "cursor=not-a-cursor",
        "cursor=WzEsMiwiMyJd",  # base64 JSON of the wrong shape
        "colour=blue",
    ],
)
async def test_bad_queries_get_400(client: Client, query: str) -> None:
    await problem(await client.get(f"/v1/jobs?{query}", headers=AUTH_A), 400, "invalid_request")


async def test_a_cursor_is_bound_to_its_filters(client: Client) -> None:
    for n in range(3):
        await _submit(client, n)
    body = await (await client.get("/v1/jobs?limit=1", headers=AUTH_A)).json()
    cursor = body["next_cursor"]
    assert cursor
    ok = await client.get(f"/v1/jobs?limit=1&cursor={cursor}", headers=AUTH_A)
    assert ok.status == 200
    await problem(
        await client.get(f"/v1/jobs?status=queued&cursor={cursor}", headers=AUTH_A),
        400,
        "invalid_request",
    )


async def test_index_is_written_with_the_job_and_trimmed_to_the_retention(
    make_client: ClientFactory, redis: Redis, settings: Settings
) -> None:
    client = await make_client(job_retention_s=3600)
    keys = KeySchema()
    index = keys.tenant_jobs(0, "acme")
    job = await _submit(client, 0)
    assert job["id"] in await redis.zrange(index, 0, -1)
    assert 0 < await redis.pttl(index) <= 3600 * 1000
    # The members past the retention go at one enqueue in eight, those whose id ends in '0'
    # (a ULID's last character carries 3 random bits): not at this one, at that one. (The
    # stale member goes in after the submission above, whose id may itself end in '0'.)
    stale_ms = int(time.time() * 1000) - 3600 * 1000 - 60_000
    await redis.zadd(index, {"job_000stale": stale_ms})
    queue = JobQueue(redis, settings.with_overrides(job_retention_s=3600))
    spec = JobSpec(tenant="acme", quality="preview")
    not_trimming = new_job_id(0)[:-1] + "4"
    await queue.enqueue(spec, job_id=not_trimming)
    assert "job_000stale" in await redis.zrange(index, 0, -1)
    trimming = new_job_id(0)[:-1] + "0"
    await queue.enqueue(spec, job_id=trimming)
    members = await redis.zrange(index, 0, -1)
    assert "job_000stale" not in members
    assert {job["id"], not_trimming, trimming} <= set(members)
    assert 0 < await redis.pttl(keys.job_history(job["id"])) <= 3600 * 1000
    # Cancel: a terminal record expires after the configured retention, not 7 days.
    await client.post(f"/v1/jobs/{job['id']}/cancel", headers=AUTH_A)
    assert 0 < await redis.pttl(keys.job(job["id"])) <= 3600 * 1000


async def test_expired_records_are_skipped(client: Client, redis: Redis) -> None:
    jobs = [await _submit(client, n) for n in range(3)]
    await redis.delete(KeySchema().job(jobs[1]["id"]))
    ids, _ = await _all_pages(client, "limit=1")
    assert ids == [jobs[2]["id"], jobs[0]["id"]]


async def _canceled_jobs(redis: Redis, settings: Settings, count: int, tenant: str) -> None:
    """`count` canceled jobs of `tenant`, made through the engine (enqueue, cancel)."""
    queue = JobQueue(redis, settings)
    for n in range(count):
        created = await queue.enqueue(JobSpec(tenant=tenant, quality="preview", metadata={"n": n}))
        assert await queue.cancel(created.job_id, tenant) == "canceled"


async def _reads_of_records(redis: Redis) -> int:
    """Job-record reads Redis has served since the last CONFIG RESETSTAT."""
    stats = await redis.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("hgetall", "hmget"))


async def test_a_filter_that_matches_nothing_costs_o_page_per_request(
    make_client: ClientFactory, redis: Redis, settings: Settings
) -> None:
    """A status filter over a long history that matches nothing: each page examines a few
    index entries per item asked for (never the whole history), answers a short page with a
    cursor, and following the cursors walks the history to its end."""
    client = await make_client()
    await _canceled_jobs(redis, settings, 300, "acme")
    await redis.config_resetstat()
    resp = await client.get("/v1/jobs?status=completed&limit=1", headers=AUTH_A)
    assert resp.status == 200, await resp.text()
    body = await resp.json()
    assert await _reads_of_records(redis) <= scan_budget(1) + 2
    assert body["items"] == []
    assert body["next_cursor"] is not None  # a short page: go on from its cursor
    ids, pages = await _all_pages(client, "status=completed&limit=1")
    assert ids == []
    assert pages <= 300 // scan_budget(1) + 2  # every page examined a full budget
    # A page that finds its jobs reads whole records of those only.
    await redis.config_resetstat()
    resp = await client.get("/v1/jobs?status=canceled&limit=5", headers=AUTH_A)
    assert len((await resp.json())["items"]) == 5
    assert await _reads_of_records(redis) <= scan_budget(5) + 5 + 2


async def test_listing_is_rate_limited_per_tenant(make_client: ClientFactory) -> None:
    """Listings have a token bucket per tenant of their own: past it 429 rate_limited with
    Retry-After, while another tenant lists and the same tenant still submits."""
    client = await make_client(list_rate_limit_per_s=0.01, list_rate_limit_burst=2)
    for _ in range(2):
        assert (await client.get("/v1/jobs", headers=AUTH_A)).status == 200
    refused = await client.get("/v1/jobs?status=completed", headers=AUTH_A)
    await problem(refused, 429, "rate_limited")
    assert int(refused.headers["Retry-After"]) >= 1
    assert (await client.get("/v1/jobs", headers=AUTH_B)).status == 200
    await _submit(client, 0)
