"""The Python client (splatq.shared.client) against the real gateway over loopback, and
against small real aiohttp servers for what the gateway does not do on demand (429/503 with
Retry-After, multi-line SSE data)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from splatq.shared.client import (
    ApiProblem,
    Event,
    Job,
    RetryPolicy,
    SplatqClient,
    SyncSplatqClient,
    parse_retry_after,
)
from splatq.shared.client.sse import SseDecoder
from splatq.shared.engine.events import EventType
from splatq.shared.engine.states import JobStatus
from splatq.shared.testing import WorkerFactory
from tests.gateway.conftest import AUTH_A, KEY_A, ClientFactory
from tests.gateway.test_api import PNG

FAST = RetryPolicy(attempts=4, base_s=0.01, cap_s=0.05, deadline_s=30)


def _url(client: Any) -> str:
    return str(client.make_url("")).rstrip("/")


# -- against the real gateway ------------------------------------------------------------


async def test_run_submits_and_follows_events_to_a_typed_final_job(
    make_client: ClientFactory, start_worker: WorkerFactory
) -> None:
    gateway = await make_client()
    await start_worker()
    events: list[Event] = []
    async with SplatqClient(_url(gateway), KEY_A, retry=FAST) as client:
        job = await client.run(
            PNG,
            quality="preview",
            cache=False,
            metadata={"sleep_s": 0.3, "who": "run"},
            on_event=events.append,
            timeout_s=60,
        )
        again = await client.get(job.id)
    assert isinstance(job, Job)
    assert job.status is JobStatus.COMPLETED
    assert job.finished
    assert job.progress == 1.0
    assert job.metadata["who"] == "run"
    assert isinstance(job.created_at, datetime)
    assert job.created_at.tzinfo is not None
    assert job.error is None
    assert again == job  # the same typed record (raw is not compared)
    kinds = [e.type for e in events]
    assert kinds[-1] is EventType.COMPLETED
    assert EventType.PROGRESS in kinds
    assert all(e.data.get("job_id") == job.id for e in events)


async def test_a_failed_job_is_typed_with_its_error(
    make_client: ClientFactory, start_worker: WorkerFactory
) -> None:
    gateway = await make_client()
    await start_worker()
    async with SplatqClient(_url(gateway), KEY_A, retry=FAST) as client:
        job = await client.run(
            PNG, quality="preview", cache=False, metadata={"fail": "permanent"}, timeout_s=60
        )
    assert job.status is JobStatus.FAILED
    assert job.error is not None
    assert job.error.code
    assert job.error.retryable is False


async def test_wait_polls_when_the_gateway_refuses_the_event_stream(
    make_client: ClientFactory, start_worker: WorkerFactory
) -> None:
    """One stream per key allowed, and it is taken: `run` still returns the final job (429
    too_many_streams -> polling), and never saw an event."""
    gateway = await make_client(sse_max_streams_per_tenant=1)
    await start_worker()
    url = _url(gateway)
    events: list[Event] = []
    async with SplatqClient(url, KEY_A, retry=FAST) as client, aiohttp.ClientSession() as http:
        holder = await client.submit(
            PNG, quality="preview", cache=False, metadata={"sleep_s": 30, "who": "holder"}
        )
        async with http.get(f"{url}/v1/jobs/{holder.id}/events", headers=AUTH_A) as held:
            assert held.status == 200
            job = await client.run(
                PNG,
                quality="preview",
                cache=False,
                metadata={"sleep_s": 0.2, "who": "polled"},
                on_event=events.append,
                poll_interval_s=0.05,
                timeout_s=60,
            )
        await client.cancel(holder.id)
    assert job.status is JobStatus.COMPLETED
    assert events == []


async def test_wait_gives_up_after_its_timeout(make_client: ClientFactory) -> None:
    gateway = await make_client()  # no worker: the job stays queued
    async with SplatqClient(_url(gateway), KEY_A, retry=FAST) as client:
        job = await client.submit(PNG, quality="preview", cache=False, metadata={"w": "t/o"})
        with pytest.raises(TimeoutError):
            await client.wait(job.id, timeout_s=0.3)
        assert (await client.cancel(job.id)).status is JobStatus.CANCELED


async def test_the_sync_client_runs_from_a_thread_against_the_gateway(
    make_client: ClientFactory, start_worker: WorkerFactory
) -> None:
    gateway = await make_client()
    await start_worker()

    def use() -> tuple[Job, list[str]]:
        with SyncSplatqClient(_url(gateway), KEY_A, retry=FAST) as client:
            job = client.run(PNG, quality="preview", cache=False, metadata={"sleep_s": 0.1})
            names = [e.name for e in client.events(job.id)]
            return job, names

    job, names = await asyncio.to_thread(use)
    assert job.status is JobStatus.COMPLETED
    assert names[-1] == EventType.COMPLETED.value  # the history replays, then the stream ends


async def test_problems_keep_the_contract_code(make_client: ClientFactory) -> None:
    gateway = await make_client()
    async with SplatqClient(_url(gateway), "wrong-key", retry=FAST) as client:
        with pytest.raises(ApiProblem) as refused:
            await client.get("job_nope")
    assert refused.value.status == 401
    assert refused.value.code == "unauthorized"


# -- small real servers for the rest -----------------------------------------------------

JOB = {"id": "job_stub", "status": "queued", "quality": "preview", "stream": "interactive",
       "created_at": "2026-12-01T00:00:00Z", "attempts": 0, "progress": 0.0, "cached": False,
       "metadata": {}, "artifacts": None, "error": None}  # fmt: skip
DONE = {**JOB, "status": "completed", "progress": 1.0}


class Stub:
    """An aiohttp server whose answers the test scripts; it records each request."""

    def __init__(self) -> None:
        self.requests: list[tuple[float, web.Request]] = []
        self.answers: list[Callable[[web.Request], web.StreamResponse]] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        self.requests.append((asyncio.get_running_loop().time(), request))
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        return answer(request)


def refuse(status: int, retry_after: str | None) -> Callable[[web.Request], web.Response]:
    code = {429: "rate_limited", 503: "overloaded"}.get(status, "error")
    headers = {"Retry-After": retry_after} if retry_after is not None else {}
    body = orjson.dumps({"type": "about:blank", "title": code, "status": status,
                         "detail": "try later", "code": code})  # fmt: skip
    return lambda _: web.Response(
        status=status, body=body, content_type="application/problem+json", headers=headers
    )


def ok(doc: dict[str, Any], status: int = 200) -> Callable[[web.Request], web.Response]:
    return lambda _: web.json_response(doc, status=status)


@pytest.fixture
async def stub() -> AsyncIterator[tuple[Stub, str]]:
    s = Stub()
    server = TestServer(s.app())
    await server.start_server()
    yield s, str(server.make_url("")).rstrip("/")
    await server.close()


async def test_429_and_503_are_retried_after_their_retry_after(stub: tuple[Stub, str]) -> None:
    s, url = stub
    s.answers = [refuse(429, "1"), refuse(503, "0"), ok(JOB, 202)]
    async with SplatqClient(url, "k", retry=FAST) as client:
        job = await client.submit(b"png", quality="preview")
    assert job.id == "job_stub"
    assert len(s.requests) == 3
    (t0, first), (t1, _), _ = s.requests
    assert t1 - t0 >= 1.0  # Retry-After: 1 was waited out (asyncio.sleep never ends early)
    keys = {r.headers["Idempotency-Key"] for _, r in s.requests}
    assert len(keys) == 1  # every retry is the same submission
    assert first.headers["Authorization"] == "Bearer k"


async def test_retries_are_bounded_in_attempts(stub: tuple[Stub, str]) -> None:
    s, url = stub
    s.answers = [refuse(503, "0")]
    async with SplatqClient(url, "k", retry=RetryPolicy(attempts=3, base_s=0.01)) as client:
        with pytest.raises(ApiProblem) as exc:
            await client.get("job_stub")
    assert exc.value.status == 503
    assert exc.value.code == "overloaded"
    assert len(s.requests) == 3


async def test_a_retry_after_past_the_deadline_is_not_waited_for(stub: tuple[Stub, str]) -> None:
    s, url = stub
    s.answers = [refuse(429, "20"), ok(JOB)]
    async with SplatqClient(url, "k", retry=RetryPolicy(deadline_s=5)) as client:
        with pytest.raises(ApiProblem) as exc:
            await client.get("job_stub")
    assert exc.value.retry_after == 20.0
    assert len(s.requests) == 1


async def test_client_errors_and_unsafe_requests_are_not_retried(stub: tuple[Stub, str]) -> None:
    s, url = stub
    s.answers = [lambda _: web.json_response({"code": "not_found", "detail": "no"}, status=404)]
    async with SplatqClient(url, "k", retry=FAST) as client:
        with pytest.raises(ApiProblem):
            await client.get("job_stub")
        assert len(s.requests) == 1
        s.answers = [lambda _: web.Response(status=502, text="bad gateway")]
        with pytest.raises(ApiProblem) as exc:
            await client.cancel("job_stub")  # a repeated cancel could answer 409: not retried
        assert exc.value.status == 502
        assert len(s.requests) == 2
    s.requests.clear()
    s.answers = [lambda _: web.Response(status=502, text="bad gateway"), ok(DONE)]
    async with SplatqClient(url, "k", retry=FAST) as client:
        assert (await client.get("job_stub")).status is JobStatus.COMPLETED  # GET: retried
    assert len(s.requests) == 2


def sse(body: str) -> Callable[[web.Request], web.Response]:
    return lambda _: web.Response(body=body.encode(), content_type="text/event-stream")


MULTI_LINE = (
    ": keep-alive\n\n"
    "id: 1-0\nevent: 3d_reconstruction.progress\n"
    'data: {"event": "3d_reconstruction.progress",\n'
    'data:  "data": {"job_id": "job_stub",\n'
    'data: "progress": 0.5}}\n\n'
    "id: 2-0\nevent: 3d_reconstruction.completed\n"
    'data: {"event": "3d_reconstruction.completed", "data": {"job_id": "job_stub"}}\n\n'
    "id: 3-0\nevent: 3d_reconstruction.progress\ndata: {}\n\n"
)


async def test_multi_line_sse_data_is_joined_and_the_stream_ends_at_the_terminal_event(
    stub: tuple[Stub, str],
) -> None:
    s, url = stub
    s.answers = [sse(MULTI_LINE)]
    async with SplatqClient(url, "k", retry=FAST) as client:
        events = [e async for e in client.events("job_stub")]
    assert [e.id for e in events] == ["1-0", "2-0"]
    assert events[0].data["progress"] == 0.5
    assert events[1].terminal


def test_the_sse_decoder_follows_the_field_rules() -> None:
    d = SseDecoder()
    fed = [d.feed(line) for line in ["data:[1,", "data: 2]", "id: 7", "event:x", ""]]
    assert fed[:4] == [None, None, None, None]
    assert fed[4] == Event("7", "x", [1, 2])  # type: ignore[arg-type]
    assert d.feed("") is None  # a blank line without data dispatches nothing
    assert [d.feed(x) for x in ["data: 1", "retry: 10", ""]][-1] == Event("7", "message", 1)  # type: ignore[arg-type]


def test_retry_after_is_read_as_seconds_or_an_http_date() -> None:
    now = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after("0.5") == 0.5
    assert parse_retry_after("Tue, 01 Dec 2026 12:00:30 GMT", now) == 30.0
    assert parse_retry_after("Tue, 01 Dec 2026 11:00:00 GMT", now) == 0.0
    assert parse_retry_after("soon") is None
    assert parse_retry_after("-1") is None
    assert parse_retry_after(None) is None


def test_the_backoff_is_jittered_capped_and_bounded() -> None:
    policy = RetryPolicy(attempts=4, base_s=1.0, cap_s=3.0)
    assert policy.delay_s(1, None, rand=lambda: 0.0) == 0.5
    assert policy.delay_s(1, None, rand=lambda: 1.0) == 1.0
    assert policy.delay_s(3, None, rand=lambda: 1.0) == 3.0  # 4 s step, capped at 3
    assert policy.delay_s(4, None) is None  # the 4th try was the last
    assert policy.delay_s(1, 2.0, rand=lambda: 0.0) == 2.0  # Retry-After wins
    assert policy.delay_s(1, 2.0, rand=lambda: 1.0) == pytest.approx(2.2)
    assert policy.delay_s(1, 600.0) is None  # beyond max_retry_after_s
    assert policy.retryable(429, safe=False)
    assert not policy.retryable(502, safe=False)
    assert policy.retryable(0, safe=True)


# -- the sync client where a loop already runs (Jupyter) -------------------------------------


@pytest.fixture
def threaded_stub() -> Iterator[tuple[Stub, str]]:
    """The stub on its own loop in its own thread: the test's thread may block on it."""
    s = Stub()
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(s.app())
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield s, f"http://127.0.0.1:{port}"
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=10)
    loop.close()


def test_the_sync_client_works_inside_a_running_event_loop(
    threaded_stub: tuple[Stub, str],
) -> None:
    s, url = threaded_stub
    answers = {"POST": ok(JOB, 202), "GET": ok(DONE)}
    s.answers = [lambda r: answers[r.method](r)]

    async def notebook_cell() -> Job:
        assert asyncio.get_running_loop().is_running()
        with SyncSplatqClient(url, "k", retry=FAST) as client:
            return client.run(b"png", quality="preview", poll_interval_s=0.01)

    job = asyncio.run(notebook_cell())
    assert job.status is JobStatus.COMPLETED
    assert [r.method for _, r in s.requests] == ["POST", "GET", "GET"]  # submit, SSE, get


async def test_run_replays_a_cached_jobs_events_to_on_event(
    make_client: ClientFactory, start_worker: WorkerFactory
) -> None:
    """The second run of one image is a cache hit, final at once: `on_event` still sees the
    job's events, ending with `completed`; without `on_event` nothing is streamed."""
    gateway = await make_client()
    await start_worker()
    meta = {"sleep_s": 0.1, "who": "cached"}
    async with SplatqClient(_url(gateway), KEY_A, retry=FAST) as client:
        first = await client.run(PNG, quality="preview", metadata=meta, timeout_s=60)
        seen: list[Event] = []
        second = await client.run(
            PNG, quality="preview", metadata=meta, on_event=seen.append, timeout_s=60
        )
    assert first.status is JobStatus.COMPLETED
    assert second.id == first.id  # the same computation, answered final at once
    assert second.status is JobStatus.COMPLETED
    assert [e.type for e in seen][-1] is EventType.COMPLETED
