"""The HTTP API over real loopback HTTP and a real Redis: every contract error code, the
guarantees of submission (one job per identical request, idempotency, cache), isolation,
cancel, artifacts and events."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import orjson
import pytest
from aiohttp import FormData
from aiohttp.test_utils import TestClient
from redis.asyncio import Redis

from splatq.shared.engine.queue import JobQueue
from splatq.shared.storage.store import LocalFileStorage
from splatq.shared.testing import WorkerFactory, wait_for_status
from tests.gateway import corpus
from tests.gateway.conftest import ADMIN, AUTH_A, AUTH_B, ClientFactory

Client = TestClient[Any, Any]
PNG = corpus.valid_png(64, 48, alpha=True)


def form(image: bytes = PNG, params: dict[str, Any] | None = None) -> FormData:
    data = FormData()
    data.add_field("image", image, filename="in.png", content_type="image/png")
    if params is not None:
        data.add_field("params", orjson.dumps(params).decode(), content_type="application/json")
    return data


async def nothing_left_behind(redis: Redis, storage: LocalFileStorage, inputs: int = 0) -> None:
    """No job record, no claim after a refused request, and `inputs` stored inputs: none for
    a request refused before its input was stored; one refused after (quota, overload) keeps
    it for retention, since a concurrent identical submission may need it."""
    assert [k async for k in redis.scan_iter("splatq:*:job:*")] == []
    assert [k async for k in redis.scan_iter("splatq:*:idem:*")] == []
    root = storage.root / "inputs"
    assert len([p for p in root.rglob("*") if p.is_file()] if root.exists() else []) == inputs


async def problem(resp: Any, status: int, code: str) -> dict[str, Any]:
    assert resp.status == status, await resp.text()
    assert resp.content_type == "application/problem+json"
    body = await resp.json(content_type=None)
    assert body["code"] == code
    assert body["status"] == status
    assert body["title"]
    assert body["detail"]
    assert body["type"]
    return dict(body)


async def test_multipart_submission_is_accepted_with_location(
    client: Client, redis: Redis, storage: LocalFileStorage
) -> None:
    """202, Location, a queued job with the contract's fields; the input is stored."""
    resp = await client.post(
        "/v1/jobs",
        data=form(params={"quality": "preview", "metadata": {"order": 7}}),
        headers=AUTH_A,
    )
    assert resp.status == 202
    job = await resp.json()
    assert resp.headers["Location"] == f"/v1/jobs/{job['id']}"
    assert resp.headers["X-Request-ID"]
    assert len(resp.headers["X-Trace-ID"]) == 32
    assert job["status"] == "queued"
    assert job["quality"] == "preview"
    assert job["stream"] == "interactive"
    assert job["metadata"] == {"order": 7}
    assert job["cached"] is False
    assert job["error"] is None
    assert job["artifacts"] is None
    assert job["urls"]["get"] == f"http://gateway.test/v1/jobs/{job['id']}"
    assert len(list((storage.root / "inputs").rglob("*.png"))) == 1


@pytest.mark.parametrize("as_data_url", [False, True])
async def test_json_base64_submission_is_accepted(client: Client, as_data_url: bool) -> None:
    """JSON with the image as base64 or as a data: URL; full quality goes to synthesis."""
    b64 = base64.b64encode(PNG).decode()
    image = f"data:image/png;base64,{b64}" if as_data_url else b64
    resp = await client.post("/v1/jobs", json={"image": image, "quality": "full"}, headers=AUTH_A)
    assert resp.status == 202
    assert (await resp.json())["stream"] == "synthesis"


@pytest.mark.parametrize(
    ("headers", "detail"),
    [
        ({}, "missing"),
        ({"Authorization": "Bearer nope"}, "unknown"),
        ({"Authorization": "Basic a2V5"}, "missing"),
    ],
)
async def test_unauthenticated_requests_get_401(
    client: Client,
    redis: Redis,
    storage: LocalFileStorage,
    headers: dict[str, str],
    detail: str,
) -> None:
    resp = await client.post("/v1/jobs", data=form(), headers=headers)
    body = await problem(resp, 401, "unauthorized")
    assert detail in body["detail"]
    await nothing_left_behind(redis, storage)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"quality": "ultra"}, "quality"),
        ({"colour": "red"}, "colour"),
        ({"webhook_url": "ftp://example.com/x"}, "webhook_url"),
        ({"webhook_url": "https://user:pw@example.com/x"}, "webhook_url"),
        ({"webhook_url": "https://127.0.0.1/hook"}, "webhook_url"),
        ({"webhook_url": "https://169.254.169.254/latest/meta-data"}, "webhook_url"),
        ({"webhook_url": "http://example.com/hook"}, "webhook_url"),
        ({"webhook_events": ["3d_reconstruction.exploded"]}, "webhook_events"),
        ({"metadata": {"blob": "x" * 5000}}, "metadata"),
        ({"metadata": [1, 2]}, "metadata"),
        ({"cache": "yes"}, "cache"),
    ],
)
async def test_invalid_params_get_400_naming_the_field(
    client: Client, redis: Redis, storage: LocalFileStorage, body: dict[str, Any], field: str
) -> None:
    """Each bad param is refused with 400 invalid_request whose detail names it."""
    resp = await client.post("/v1/jobs", data=form(params=body), headers=AUTH_A)
    assert field in (await problem(resp, 400, "invalid_request"))["detail"]
    await nothing_left_behind(redis, storage)


async def test_bad_json_and_bad_base64_get_400(client: Client) -> None:
    resp = await client.post(
        "/v1/jobs", data=b"{not json", headers={**AUTH_A, "Content-Type": "application/json"}
    )
    await problem(resp, 400, "invalid_request")
    resp = await client.post("/v1/jobs", json={"image": "!!!not base64"}, headers=AUTH_A)
    await problem(resp, 400, "invalid_request")
    resp = await client.post("/v1/jobs", json={"quality": "preview"}, headers=AUTH_A)
    await problem(resp, 400, "invalid_request")


async def test_bad_idempotency_key_gets_400(client: Client) -> None:
    resp = await client.post(
        "/v1/jobs", data=form(), headers={**AUTH_A, "Idempotency-Key": "x" * 256}
    )
    await problem(resp, 400, "invalid_request")


async def test_oversized_body_gets_413_before_it_is_read(
    client: Client, redis: Redis, storage: LocalFileStorage
) -> None:
    """A body over SPLATQ_MAX_UPLOAD_BYTES: 413 payload_too_large, nothing stored."""
    big = corpus.random_bytes(3 * 1024 * 1024)
    resp = await client.post("/v1/jobs", data=form(big), headers=AUTH_A)
    await problem(resp, 413, "payload_too_large")
    resp = await client.post(
        "/v1/jobs", json={"image": base64.b64encode(big).decode()}, headers=AUTH_A
    )
    await problem(resp, 413, "payload_too_large")
    await nothing_left_behind(redis, storage)


@pytest.mark.parametrize(
    ("image", "status", "code"),
    [
        (corpus.truncated_png(), 422, "invalid_image"),
        (corpus.truncated_jpeg(), 422, "invalid_image"),
        (corpus.empty(), 422, "invalid_image"),
        (corpus.huge_png_header(30000, 30000), 422, "image_too_large"),
        (corpus.gif_1x1(), 415, "unsupported_media_type"),
        (corpus.random_bytes(), 415, "unsupported_media_type"),
        (corpus.polyglot(), None, None),
    ],
)
async def test_malformed_images_are_refused_with_their_code(
    client: Client,
    redis: Redis,
    storage: LocalFileStorage,
    image: bytes,
    status: int | None,
    code: str | None,
) -> None:
    """The generated corpus: each malformed image gets its 4xx code and leaves nothing."""
    resp = await client.post("/v1/jobs", data=form(image), headers=AUTH_A)
    if status is None:  # the polyglot: refused as the validator documents, never a 5xx
        assert resp.status in {415, 422}
    else:
        await problem(resp, status, code or "")
    await nothing_left_behind(redis, storage)


async def test_unsupported_content_type_gets_415(client: Client) -> None:
    resp = await client.post(
        "/v1/jobs", data=b"hello", headers={**AUTH_A, "Content-Type": "text/plain"}
    )
    await problem(resp, 415, "unsupported_media_type")


async def test_hundred_concurrent_identical_submissions_make_one_job(
    client: Client, redis: Redis, queue: JobQueue
) -> None:
    """Single-flight: 100 identical requests at once are coalesced onto one job."""
    png = corpus.valid_png(40, 40, alpha=True)
    resps = await asyncio.gather(*(
        client.post("/v1/jobs", data=form(png, {"quality": "preview"}), headers=AUTH_A)
        for _ in range(100)
    ))  # fmt: skip
    assert {r.status for r in resps} == {202}
    ids = {(await r.json())["id"] for r in resps}
    assert len(ids) == 1
    total = sum([await redis.xlen(k) async for k in redis.scan_iter("splatq:*:stream:*")])
    assert total == 1


async def test_idempotency_key_returns_the_same_job_and_refuses_another_payload(
    client: Client,
) -> None:
    """Same key + same payload -> same job; same key + different image -> 422."""
    h = {**AUTH_A, "Idempotency-Key": "order-1234"}
    first = await client.post("/v1/jobs", data=form(params={"quality": "preview"}), headers=h)
    again = await client.post("/v1/jobs", data=form(params={"quality": "preview"}), headers=h)
    assert first.status == again.status == 202
    assert (await first.json())["id"] == (await again.json())["id"]
    other = await client.post(
        "/v1/jobs", data=form(corpus.valid_png(10, 10), {"quality": "preview"}), headers=h
    )
    await problem(other, 422, "idempotency_key_reused")
    # another tenant may use the same key string independently
    theirs = await client.post(
        "/v1/jobs",
        data=form(params={"quality": "preview"}),
        headers={**AUTH_B, "Idempotency-Key": "order-1234"},
    )
    assert theirs.status == 202
    assert (await theirs.json())["id"] != (await first.json())["id"]


async def test_completed_result_is_served_from_the_cache(
    client: Client, queue: JobQueue, start_worker: WorkerFactory
) -> None:
    """After completion an identical submission is answered 200 with cached: true; with
    cache: false it makes a new job."""
    first = await (
        await client.post("/v1/jobs", data=form(params={"quality": "preview"}), headers=AUTH_A)
    ).json()
    await start_worker()
    await wait_for_status(queue, first["id"], {"completed"})
    hit = await client.post("/v1/jobs", data=form(params={"quality": "preview"}), headers=AUTH_A)
    assert hit.status == 200
    body = await hit.json()
    assert (body["id"], body["cached"], body["status"]) == (first["id"], True, "completed")
    miss = await client.post(
        "/v1/jobs", data=form(params={"quality": "preview", "cache": False}), headers=AUTH_A
    )
    assert miss.status == 202
    assert (await miss.json())["id"] != first["id"]
    # the cache is per tenant: another tenant's identical image is a new job
    theirs = await client.post("/v1/jobs", data=form(params={"quality": "preview"}), headers=AUTH_B)
    assert theirs.status == 202


async def test_another_tenants_job_answers_404_everywhere(client: Client) -> None:
    """Tenant isolation: GET, cancel, events and artifacts of acme's job are 404 for beta."""
    job = await (await client.post("/v1/jobs", data=form(), headers=AUTH_A)).json()
    base = f"/v1/jobs/{job['id']}"
    assert (await client.get(base, headers=AUTH_A)).status == 200
    await problem(await client.get(base, headers=AUTH_B), 404, "not_found")
    await problem(await client.post(f"{base}/cancel", headers=AUTH_B), 404, "not_found")
    await problem(await client.get(f"{base}/events", headers=AUTH_B), 404, "not_found")
    await problem(await client.get(f"{base}/artifacts/splat", headers=AUTH_B), 404, "not_found")
    await problem(await client.get("/v1/jobs/job_999XYZ", headers=AUTH_A), 404, "not_found")


async def test_cancel_a_queued_job_then_409(client: Client) -> None:
    job = await (await client.post("/v1/jobs", data=form(), headers=AUTH_A)).json()
    resp = await client.post(f"/v1/jobs/{job['id']}/cancel", headers=AUTH_A)
    assert resp.status == 202
    assert (await resp.json())["status"] == "canceled"
    await problem(
        await client.post(f"/v1/jobs/{job['id']}/cancel", headers=AUTH_A), 409, "already_finished"
    )
    await problem(
        await client.get(f"/v1/jobs/{job['id']}/artifacts/splat", headers=AUTH_A), 409, "not_ready"
    )


async def test_rate_limit_answers_429_with_retry_after(make_client: ClientFactory) -> None:
    """A tenant over its token bucket gets 429 rate_limited + Retry-After; others do not."""
    client = await make_client(rate_limit_per_s=0.5, rate_limit_burst=2)
    statuses = [
        (await client.post("/v1/jobs", data=form(), headers=AUTH_A)).status for _ in range(2)
    ]
    assert statuses == [202, 202]
    resp = await client.post("/v1/jobs", data=form(), headers=AUTH_A)
    await problem(resp, 429, "rate_limited")
    assert int(resp.headers["Retry-After"]) >= 1
    assert (await client.post("/v1/jobs", data=form(), headers=AUTH_B)).status == 202


async def test_backlog_limit_answers_503_with_retry_after_and_records_no_job(
    make_client: ClientFactory, redis: Redis, storage: LocalFileStorage
) -> None:
    """A full interactive stream refuses new work at the door (503 overloaded): no job; the
    stored input stays for retention (a concurrent identical submission may need it)."""
    client = await make_client(max_backlog_interactive=2, tenant_backlog_share=1.0)
    for i in range(2):
        resp = await client.post(
            "/v1/jobs",
            data=form(corpus.valid_png(8 + i, 8), {"quality": "preview"}),
            headers=AUTH_A,
        )
        assert resp.status == 202
    resp = await client.post(
        "/v1/jobs", data=form(corpus.valid_png(20, 8), {"quality": "preview"}), headers=AUTH_A
    )
    await problem(resp, 503, "overloaded")
    assert resp.headers["Retry-After"] == "5"
    jobs = [
        k
        async for k in redis.scan_iter("splatq:*:job:*")
        if not k.endswith((":events", ":h", ":wake"))
    ]
    assert len(jobs) == 2
    assert len(list((storage.root / "inputs").rglob("*.png"))) == 3


async def test_a_tenant_at_its_backlog_share_is_refused_alone(
    make_client: ClientFactory, redis: Redis, storage: LocalFileStorage
) -> None:
    """Tenant A with its share (25 % of 8 = 2 unfinished jobs) full gets 429
    tenant_backlog_full and no job (its input stays for retention); tenant B still gets 202;
    canceling one of A's jobs gives A room again."""
    client = await make_client(max_backlog_interactive=8, tenant_backlog_share=0.25)
    ids = []
    for i in range(2):
        resp = await client.post(
            "/v1/jobs",
            data=form(corpus.valid_png(8 + i, 8), {"quality": "preview"}),
            headers=AUTH_A,
        )
        assert resp.status == 202
        ids.append((await resp.json())["id"])
    resp = await client.post(
        "/v1/jobs", data=form(corpus.valid_png(30, 8), {"quality": "preview"}), headers=AUTH_A
    )
    await problem(resp, 429, "tenant_backlog_full")
    assert int(resp.headers["Retry-After"]) >= 1
    jobs = [
        k
        async for k in redis.scan_iter("splatq:*:job:*")
        if not k.endswith((":events", ":h", ":wake"))
    ]
    assert len(jobs) == 2
    assert len(list((storage.root / "inputs").rglob("*.png"))) == 3
    for i in range(2):  # B's own share, untouched by A's
        resp = await client.post(
            "/v1/jobs", data=form(corpus.valid_png(40 + i, 8), {"quality": "preview"}),
            headers=AUTH_B,
        )  # fmt: skip
        assert resp.status == 202
    assert (await client.post(f"/v1/jobs/{ids[0]}/cancel", headers=AUTH_A)).status in {200, 202}
    resp = await client.post(
        "/v1/jobs", data=form(corpus.valid_png(31, 8), {"quality": "preview"}), headers=AUTH_A
    )
    assert resp.status == 202


async def test_health_ready_metrics_openapi(client: Client) -> None:
    """Probes answer without auth, /metrics on the API port only with the admin key; the
    OpenAPI document lists every route."""
    assert (await client.get("/healthz")).status == 200
    assert (await client.get("/readyz")).status == 200
    await problem(await client.get("/metrics"), 401, "unauthorized")
    await problem(await client.get("/metrics", headers=AUTH_A), 403, "forbidden")
    text = await (await client.get("/metrics", headers=ADMIN)).text()
    assert "splatq_http_requests_total" in text
    assert "splatq_queue_depth" in text
    doc = await (await client.get("/openapi.json")).json()
    assert doc["openapi"].startswith("3.1")
    routes = {r.resource.canonical for r in client.app.router.routes()}  # type: ignore[union-attr]
    assert routes == set(doc["paths"])


async def test_unknown_route_and_method_are_problems(client: Client) -> None:
    await problem(await client.get("/nope"), 404, "not_found")
    await problem(await client.delete("/v1/jobs", headers=AUTH_A), 405, "method_not_allowed")


async def _read_sse(resp: Any) -> list[dict[str, str]]:
    """Parse a finished SSE body into messages (comments dropped)."""
    text = await resp.text()
    messages = []
    for block in text.strip().split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            if line.startswith(":") or ": " not in line:
                continue
            name, _, value = line.partition(": ")
            fields[name] = value
        if fields:
            messages.append(fields)
    return messages


async def test_events_stream_replays_and_resumes_after_last_event_id(
    client: Client, queue: JobQueue, start_worker: WorkerFactory
) -> None:
    """SSE: every event of the job in order (id, event, data = the webhook payload), ending
    after the terminal one; Last-Event-ID resumes after that event."""
    job = await (
        await client.post("/v1/jobs", data=form(params={"quality": "preview"}), headers=AUTH_A)
    ).json()
    await start_worker()
    await wait_for_status(queue, job["id"], {"completed"})
    resp = await client.get(f"/v1/jobs/{job['id']}/events", headers=AUTH_A)
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    messages = await _read_sse(resp)
    kinds = [m["event"] for m in messages]
    assert kinds[0] == "3d_reconstruction.queued"
    assert kinds[-1] == "3d_reconstruction.completed"
    payload = orjson.loads(messages[-1]["data"])
    assert payload["event"] == kinds[-1]
    assert payload["data"]["job_id"] == job["id"]
    resumed = await client.get(
        f"/v1/jobs/{job['id']}/events", headers={**AUTH_A, "Last-Event-ID": messages[0]["id"]}
    )
    assert [m["event"] for m in await _read_sse(resumed)] == kinds[1:]
    bad = await client.get(
        f"/v1/jobs/{job['id']}/events", headers={**AUTH_A, "Last-Event-ID": "evt_nonsense"}
    )
    await problem(bad, 400, "invalid_request")


async def test_events_stream_follows_a_live_job_with_keepalives(
    make_client: ClientFactory, queue: JobQueue, start_worker: WorkerFactory
) -> None:
    """Connected before the job runs: keep-alive comments, then the live events, then EOF."""
    client = await make_client(sse_keepalive_s=0.1)
    png = corpus.valid_png(30, 30, alpha=True)
    job = await (
        await client.post(
            "/v1/jobs",
            data=form(png, {"quality": "preview", "metadata": {"sleep_s": 0.5}}),
            headers=AUTH_A,
        )
    ).json()
    reader = asyncio.create_task(client.get(f"/v1/jobs/{job['id']}/events", headers=AUTH_A))
    await asyncio.sleep(0.3)
    await start_worker()
    resp = await asyncio.wait_for(reader, 15)
    text = await asyncio.wait_for(resp.text(), 15)
    assert ": keep-alive" in text
    assert text.rstrip().endswith("}")
    assert "event: 3d_reconstruction.completed" in text
    assert "event: 3d_reconstruction.progress" in text


@pytest.mark.parametrize(
    "body",
    [
        b"--B\r\n--B--\r\n",
        b"--B\r\nFalse--B--\r\n",
        b'--B\r\nContent-Disposition: form-data; name="a\x01b"\r\n\r\nx\r\n--B--\r\n',
    ],
)
async def test_malformed_multipart_bodies_get_400(client: Client, body: bytes) -> None:
    """Unparsable multipart framing or part headers are the client's error (400), not 500."""
    resp = await client.post(
        "/v1/jobs",
        data=body,
        headers={**AUTH_A, "Content-Type": "multipart/form-data; boundary=B"},
    )
    await problem(resp, 400, "invalid_request")


@pytest.mark.parametrize("last", ["99999999999999999999-0", "\u0661-\u0661", "1-"])
async def test_event_ids_redis_would_refuse_get_400_not_a_hang(client: Client, last: str) -> None:
    """Last-Event-ID values outside Redis's id space are refused up front (no open stream)."""
    job = await (await client.post("/v1/jobs", data=form(), headers=AUTH_A)).json()
    resp = await client.get(
        f"/v1/jobs/{job['id']}/events", headers={**AUTH_A, "Last-Event-ID": last}
    )
    await problem(resp, 400, "invalid_request")


async def test_private_webhook_urls_are_allowed_only_when_configured(
    make_client: ClientFactory,
) -> None:
    """SPLATQ_WEBHOOK_ALLOW_PRIVATE=1 (development) admits a loopback http webhook_url."""
    client = await make_client(webhook_allow_private=True)
    resp = await client.post(
        "/v1/jobs",
        data=form(params={"webhook_url": "http://127.0.0.1:9000/hook"}),
        headers=AUTH_A,
    )
    assert resp.status == 202
