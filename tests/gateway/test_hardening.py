"""Gateway hardening (issue #9) over real loopback HTTP and real redis-servers: event-stream
caps and their own Redis pool, no 500 for a client's bytes or a client's disconnect, no
secret in any log line, bounded metric labels, 503 while Redis is down, and the cache
answering for jobs that were submitted with an Idempotency-Key."""

from __future__ import annotations

import asyncio
import io
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import structlog
from aiohttp.test_utils import TestClient
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis

from splatq.services.gateway.stream_caps import StreamCaps
from splatq.shared.engine.fairness import home_partition
from splatq.shared.engine.ids import is_job_id, new_job_id, partition_of
from splatq.shared.engine.queue import JobQueue
from splatq.shared.logs import configure_logging
from splatq.shared.redis.server import RedisServer
from splatq.shared.settings import Settings
from splatq.shared.testing import WorkerFactory, eventually, wait_for_status
from tests.gateway import corpus
from tests.gateway.conftest import ADMIN, AUTH_A, AUTH_B, KEY_A, KEY_B, ClientFactory
from tests.gateway.test_api import form, problem

Client = TestClient[Any, Any]
EVENTS_ROUTE = "/v1/jobs/{job_id}/events"
# Generous next to a loopback round trip, far below the 30 s a starved pool made callers wait.
FAST_S = 5.0


async def _queued_job(client: Client, png: bytes | None = None) -> str:
    """A job no worker will run: its event stream stays open."""
    resp = await client.post("/v1/jobs", data=form(png or corpus.valid_png(12, 12)), headers=AUTH_A)
    assert resp.status == 202
    return str((await resp.json())["id"])


def _request_counts(metrics_text: str) -> dict[tuple[str, str, str], float]:
    """splatq_http_requests_total by (route, method, status)."""
    out: dict[tuple[str, str, str], float] = {}
    for family in text_string_to_metric_families(metrics_text):
        if family.name != "splatq_http_requests":
            continue
        for sample in family.samples:
            if sample.name.endswith("_total"):
                labels = sample.labels
                out[labels["route"], labels["method"], labels["status"]] = sample.value
    return out


async def _metrics(client: Client) -> dict[tuple[str, str, str], float]:
    return _request_counts(await (await client.get("/metrics", headers=ADMIN)).text())


async def _refused_stream(resp: Any) -> None:
    """429 too_many_streams (checked before the body is read: an admitted stream never ends)."""
    assert resp.status == 429, resp.status
    await problem(resp, 429, "too_many_streams")
    assert int(resp.headers["Retry-After"]) >= 1


async def _sse_clients(redis: Redis) -> int:
    clients = await redis.client_list()
    return sum(1 for c in clients if c.get("name") == "splatq-gateway-sse")


# -- 7: event streams ---------------------------------------------------------------------


def test_stream_caps_count_per_tenant_and_in_all() -> None:
    """The caps admit up to per-tenant streams per tenant and per-process in all; a closed
    stream frees its place."""
    caps = StreamCaps(per_process=3, per_tenant=2)
    assert caps.try_open("a") is None
    assert caps.try_open("a") is None
    assert "API key" in (caps.try_open("a") or "")
    assert caps.try_open("b") is None
    assert "gateway" in (caps.try_open("c") or "")
    caps.close("a")
    assert caps.try_open("c") is None
    assert (caps.open_streams("a"), caps.open_streams("c"), caps.open_streams()) == (1, 1, 3)


async def test_a_tenant_at_its_stream_cap_gets_429_and_other_tenants_do_not_notice(
    make_client: ClientFactory, redis: Redis
) -> None:
    """Tenant A opens its cap of event streams, the next one is 429 too_many_streams with
    Retry-After; the streams hold SSE-pool connections, so with a shared pool smaller than
    A's streams, tenant B's submit and read and /readyz still answer at once."""
    cap = 4
    client = await make_client(
        sse_max_streams_per_tenant=cap, redis_max_connections=2, sse_keepalive_s=0.2
    )
    job_id = await _queued_job(client)
    streams = []
    for _ in range(cap):
        resp = await client.get(f"/v1/jobs/{job_id}/events", headers=AUTH_A)
        assert resp.status == 200
        streams.append(resp)

    async def blocking_reads_on_their_own_pool() -> bool:
        return await _sse_clients(redis) >= cap

    await eventually(blocking_reads_on_their_own_pool)
    await _refused_stream(await client.get(f"/v1/jobs/{job_id}/events", headers=AUTH_A))

    posted = await asyncio.wait_for(
        client.post("/v1/jobs", data=form(corpus.valid_png(14, 14)), headers=AUTH_B), FAST_S
    )
    assert posted.status == 202
    theirs = (await posted.json())["id"]
    read = await asyncio.wait_for(client.get(f"/v1/jobs/{theirs}", headers=AUTH_B), FAST_S)
    assert read.status == 200
    ready = await asyncio.wait_for(client.get("/readyz"), FAST_S)
    assert ready.status == 200

    # A closed stream frees its place (noticed at the stream's next keep-alive write).
    streams.pop().close()

    async def admitted_again() -> bool:
        resp = await client.get(f"/v1/jobs/{job_id}/events", headers=AUTH_A)
        if resp.status == 200:
            streams.append(resp)
            return True
        await _refused_stream(resp)
        return False

    await eventually(admitted_again)
    for resp in streams:
        resp.close()


async def test_the_gateway_wide_stream_cap_refuses_every_tenant(
    make_client: ClientFactory,
) -> None:
    """SPLATQ_SSE_MAX_STREAMS bounds one process's streams whatever the tenants."""
    client = await make_client(sse_max_streams=2, sse_max_streams_per_tenant=10)
    job_id = await _queued_job(client)
    streams = [await client.get(f"/v1/jobs/{job_id}/events", headers=AUTH_A) for _ in range(2)]
    assert [s.status for s in streams] == [200, 200]
    theirs = (
        await (
            await client.post("/v1/jobs", data=form(corpus.valid_png(9, 9)), headers=AUTH_B)
        ).json()
    )["id"]
    await _refused_stream(await client.get(f"/v1/jobs/{theirs}/events", headers=AUTH_B))
    for resp in streams:
        resp.close()


# -- 10: no 500 for the client's doing, no secret in logs ----------------------------------


@pytest.fixture
def gateway_logs(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[io.TextIOWrapper]:
    """The gateway's log output as a process configured with `fmt` (console or JSON) writes
    it to stderr, captured in memory; the previous structlog configuration comes back after."""
    saved = structlog.get_config()
    captured = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    monkeypatch.setattr(sys, "stderr", captured)
    configure_logging("info", getattr(request, "param", "json"), "gateway")
    # Loggers must not keep this configuration (and this stream) past the test.
    structlog.configure(cache_logger_on_first_use=False)
    yield captured
    structlog.configure(**saved)


def _log_text(captured: io.TextIOWrapper) -> str:
    captured.flush()
    raw = captured.buffer
    assert isinstance(raw, io.BytesIO)
    return raw.getvalue().decode()


async def _raw_http(client: Client, request: bytes) -> tuple[int, dict[str, Any]]:
    """Send bytes no HTTP library would send; (status, JSON body)."""
    reader, writer = await asyncio.open_connection(client.host, client.port)
    writer.write(request)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), FAST_S)
    writer.close()
    await writer.wait_closed()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), orjson.loads(body)


@pytest.mark.parametrize(
    "header",
    [b"Authorization: Bearer \xff", b"Authorization: Bearer ab\xfe\xffcd", b"X-Request-ID: \xff"],
)
async def test_undecodable_header_bytes_are_a_4xx_not_a_500(client: Client, header: bytes) -> None:
    """A byte that is no UTF-8 in Authorization is 401 unauthorized; in X-Request-ID it is
    replaced by a generated id. Never 500."""
    job_id = new_job_id(0)
    status, body = await _raw_http(
        client,
        b"GET /v1/jobs/"
        + job_id.encode()
        + b" HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
        + header
        + b"\r\n\r\n",
    )
    assert status == 401
    assert body["code"] == "unauthorized"


@pytest.mark.parametrize("gateway_logs", ["json"], indirect=True)
async def test_a_client_that_leaves_an_event_stream_is_no_error(
    make_client: ClientFactory, gateway_logs: io.TextIOWrapper
) -> None:
    """An SSE client that disconnects mid-stream is counted as 499, not as a 5xx, and
    logs no error and no traceback."""
    client = await make_client(sse_keepalive_s=0.05)
    job_id = await _queued_job(client)
    resp = await client.get(f"/v1/jobs/{job_id}/events", headers=AUTH_A)
    assert resp.status == 200
    await resp.content.readany()
    resp.close()

    async def stream_ended() -> bool:
        return any(route == EVENTS_ROUTE for route, _, _ in await _metrics(client))

    await eventually(stream_ended)
    counts = await _metrics(client)
    assert {s for (route, _, s) in counts if route == EVENTS_ROUTE} == {"499"}
    lines = [orjson.loads(line) for line in _log_text(gateway_logs).splitlines()]
    assert [r for r in lines if r["level"] in {"error", "critical"} or "exception" in r] == []


@pytest.mark.parametrize("gateway_logs", ["console", "json"], indirect=True)
async def test_no_api_key_reaches_the_logs_of_failing_requests(
    client: Client, queue: JobQueue, redis: Redis, gateway_logs: io.TextIOWrapper
) -> None:
    """Bad keys, malformed keys and internal errors (a corrupt job record) in both log
    formats: the tracebacks are logged, and neither tenant's API key appears anywhere."""
    png = corpus.valid_png(21, 21)
    await problem(await client.post("/v1/jobs", data=form(png), headers={
        "Authorization": f"Bearer {KEY_A}x"}), 401, "unauthorized")  # fmt: skip
    job_id = await _queued_job(client, png)
    await redis.hset(queue.keys.job(job_id), "status", "no-such-status")  # type: ignore[misc]
    await problem(
        await client.post("/v1/jobs", data=form(png), headers=AUTH_A), 500, "internal_error"
    )
    await problem(await client.get(f"/v1/jobs/{job_id}", headers=AUTH_A), 500, "internal_error")
    logged = _log_text(gateway_logs)
    assert "http.unhandled" in logged
    assert "Traceback" in logged
    assert KEY_A not in logged
    assert KEY_B not in logged


def test_settings_repr_redacts_every_secret() -> None:
    """repr(Settings) (what a traceback or a debugger shows) carries no API key, no
    password of a URL, no CLI key; the tenants and the hosts are still visible."""
    s = Settings(
        redis_url="redis://default:hunter2@redis.internal:6379/0",
        api_keys={"sk-live-1": "acme", "sk-live-2": "beta"},
        api_key="sk-cli",
        s3_endpoint_url="https://AKIA:s3cret@minio:9000",
        storage_url="s3://bucket/prefix?token=tok123",
    )
    shown = repr(s)
    for secret in ("hunter2", "sk-live-1", "sk-live-2", "sk-cli", "s3cret", "AKIA", "tok123"):
        assert secret not in shown
    assert "redis.internal:6379" in shown
    assert "acme" in shown


# -- 11: bounded labels, whole-string ids --------------------------------------------------


async def test_unknown_http_methods_share_one_metric_label(client: Client) -> None:
    """A client-chosen method name never becomes a label value: it is counted as `other`
    (llhttp refuses made-up names itself; the WebDAV and other names it knows reach us)."""
    for method in ("PROPFIND", "MKCOL", "PURGE", "REPORT"):
        resp = await client.request(method, "/v1/jobs", headers=AUTH_A)
        await problem(resp, 405, "method_not_allowed")
    methods = {m for (_, m, _) in await _metrics(client)}
    assert "other" in methods
    assert methods <= {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "other"}


async def test_ids_with_a_trailing_newline_are_refused(client: Client) -> None:
    """`$` matches before a final newline; ids are checked as whole strings."""
    job_id = await _queued_job(client)
    assert not is_job_id(job_id + "\n")
    resp = await client.get(
        f"/v1/jobs/{job_id}/events", params={"last_event_id": "1-0\n"}, headers=AUTH_A
    )
    await problem(resp, 400, "invalid_request")


# -- 12: Redis down -------------------------------------------------------------------------


async def test_redis_down_answers_503_with_retry_after_then_recovers(
    make_client: ClientFactory, tmp_path: Path
) -> None:
    """With the gateway's redis-server stopped, submissions, reads and readiness answer 503
    (unavailable + Retry-After; not_ready) instead of 500; once it is back, submissions work."""
    server = RedisServer(tmp_path / "redis", appendonly=True)
    await server.start()
    try:
        client = await make_client(redis_url=server.url)
        job_id = await _queued_job(client)
        await server.stop()
        down = await client.post("/v1/jobs", data=form(corpus.valid_png(15, 15)), headers=AUTH_A)
        await problem(down, 503, "unavailable")
        assert int(down.headers["Retry-After"]) >= 1
        read = await client.get(f"/v1/jobs/{job_id}", headers=AUTH_A)
        await problem(read, 503, "unavailable")
        assert "Retry-After" in read.headers
        await problem(await client.get("/readyz"), 503, "not_ready")
        await server.start()
        again = await client.post("/v1/jobs", data=form(corpus.valid_png(16, 16)), headers=AUTH_A)
        assert again.status == 202
        assert (await client.get(f"/v1/jobs/{job_id}", headers=AUTH_A)).status == 200
    finally:
        await server.stop()


# -- 14: the cache and Idempotency-Key ------------------------------------------------------


@pytest.mark.parametrize(("partitions", "cap"), [(1, 0), (4, 0), (4, 2)])
async def test_a_keyed_jobs_result_answers_identical_unkeyed_submissions(
    make_client: ClientFactory,
    queue: JobQueue,
    start_worker: WorkerFactory,
    partitions: int,
    cap: int,
) -> None:
    """A job submitted with an Idempotency-Key also holds its content claim (whichever
    partitions the two keys fall in, or the tenant's home partition when it has a running
    cap): an identical submission without a key joins it while it runs (202, same id) and,
    once a worker has completed it, is answered from the cache (200, cached: true)."""
    client = await make_client(partitions=partitions, tenant_max_running_interactive=cap)
    png = corpus.valid_png(33, 17, alpha=True)
    params = {"quality": "preview"}
    keyed = await client.post(
        "/v1/jobs", data=form(png, params), headers={**AUTH_A, "Idempotency-Key": "order-77"}
    )
    assert keyed.status == 202
    job_id = (await keyed.json())["id"]
    if cap:
        assert partition_of(job_id) == home_partition("acme", partitions)
    joined = await client.post("/v1/jobs", data=form(png, params), headers=AUTH_A)
    assert (joined.status, (await joined.json())["id"]) == (202, job_id)
    await start_worker(partitions=partitions, tenant_max_running_interactive=cap)
    await wait_for_status(queue, job_id, {"completed"})
    hit = await client.post("/v1/jobs", data=form(png, params), headers=AUTH_A)
    assert hit.status == 200
    body = await hit.json()
    assert (body["id"], body["cached"], body["status"]) == (job_id, True, "completed")
    # the keyed repeat still answers its own job, not as a cache hit
    again = await client.post(
        "/v1/jobs", data=form(png, params), headers={**AUTH_A, "Idempotency-Key": "order-77"}
    )
    assert (again.status, (await again.json())["cached"]) == (200, False)
    # and the key with another request is still refused, cache or not
    other = await client.post(
        "/v1/jobs",
        data=form(png, {**params, "metadata": {"n": 2}}),
        headers={**AUTH_A, "Idempotency-Key": "order-77"},
    )
    await problem(other, 422, "idempotency_key_reused")


async def test_a_failed_keyed_job_does_not_block_unkeyed_resubmissions(
    client: Client, queue: JobQueue, start_worker: WorkerFactory
) -> None:
    """The content claim a keyed job took outlives its failure, but a failed job never
    blocks: an identical unkeyed submission makes a new job, which then serves the cache."""
    png = corpus.valid_png(35, 19, alpha=True)
    failing = await client.post(
        "/v1/jobs",
        data=form(png, {"quality": "preview", "metadata": {"fail": "permanent"}}),
        headers={**AUTH_A, "Idempotency-Key": "order-78"},
    )
    failed_id = (await failing.json())["id"]
    await start_worker()
    await wait_for_status(queue, failed_id, {"failed"})
    fresh = await client.post("/v1/jobs", data=form(png, {"quality": "preview"}), headers=AUTH_A)
    assert fresh.status == 202
    fresh_id = (await fresh.json())["id"]
    assert fresh_id != failed_id
    await wait_for_status(queue, fresh_id, {"completed"})
    hit = await client.post("/v1/jobs", data=form(png, {"quality": "preview"}), headers=AUTH_A)
    assert (hit.status, (await hit.json())["id"]) == (200, fresh_id)
