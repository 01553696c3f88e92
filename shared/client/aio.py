"""`SplatqClient`: the async client for the splatq HTTP API (HTTP only, no engine I/O).

Every call goes through one retry loop (`RetryPolicy`): 429/503 honour `Retry-After`, lost
connections are retried only where a repeat is harmless. `run()` submits and waits for the
final state, following the job's events (SSE) and falling back to polling when the stream is
refused or keeps failing. `submit(wait_s=N)` asks the gateway to hold its answer until the job
ends (`Prefer: wait=N`); `list_jobs`/`iter_jobs` page through the caller's jobs.
"""

from __future__ import annotations

import asyncio
import mimetypes
import uuid
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Unpack

import aiohttp
import orjson

from splatq.shared.client.query import JobFilters, PageQuery, list_query, prefer_wait
from splatq.shared.client.retry import RetryPolicy, parse_retry_after
from splatq.shared.client.sse import parse_sse
from splatq.shared.client.types import ApiProblem, Event, Job, JobPage
from splatq.shared.storage.store import ARTIFACT_FILES

# Consecutive failed SSE connections after which `wait` polls instead.
SSE_FAILURES_BEFORE_POLLING = 3
OnEvent = Callable[[Event], None]


class SplatqClient:
    """Async client. Use as `async with SplatqClient(url, key) as c: job = await c.run(path)`."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        timeout_s: float = 60.0,
        retry: RetryPolicy | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.retry = retry or RetryPolicy()
        self._headers = {"Authorization": f"Bearer {api_key}"}
        self._timeout = aiohttp.ClientTimeout(total=timeout_s, connect=10)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> SplatqClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(headers=self._headers, timeout=self._timeout)
        return self._session

    # -- one request, retried -------------------------------------------------------------

    async def _request(
        self,
        method: str,
        path: str,
        *,
        safe: bool,
        form: Callable[[], aiohttp.FormData] | None = None,
        headers: Mapping[str, str] | None = None,
        params: Mapping[str, str] | Sequence[tuple[str, str]] | None = None,
        request_timeout: aiohttp.ClientTimeout | None = None,
    ) -> tuple[int, bytes]:
        """Send until a final answer; raise `ApiProblem` for 4xx/5xx and unreachable."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        attempt = 0
        while True:
            attempt += 1
            try:
                async with self._http().request(
                    method,
                    self.base_url + path,
                    data=form() if form is not None else None,  # a FormData is read once
                    headers=headers,
                    params=params,
                    timeout=request_timeout or self._timeout,
                ) as resp:
                    body = await resp.read()
                    if resp.status < 400:
                        return resp.status, body
                    problem = _problem(resp.status, body, resp.headers.get("Retry-After"))
            except (aiohttp.ClientError, TimeoutError) as exc:
                problem = ApiProblem(0, "unreachable", f"{type(exc).__name__}: {exc}")
            if not self.retry.retryable(problem.status, safe):
                raise problem
            delay = self.retry.delay_s(attempt, problem.retry_after)
            if delay is None or not self.retry.within_deadline(loop.time() - started, delay):
                raise problem
            await asyncio.sleep(delay)

    async def _json(self, method: str, path: str, *, safe: bool, **kw: Any) -> dict[str, Any]:
        _, body = await self._request(method, path, safe=safe, **kw)
        data: dict[str, Any] = orjson.loads(body)
        return data

    # -- the API --------------------------------------------------------------------------

    async def submit(
        self,
        image: bytes | Path | None = None,
        *,
        image_url: str | None = None,
        wait_s: int | None = None,
        quality: str = "full",
        webhook_url: str | None = None,
        webhook_events: Sequence[str] | None = None,
        metadata: Mapping[str, Any] | None = None,
        cache: bool = True,
        progressive: bool = False,
        idempotency_key: str | None = None,
    ) -> Job:
        """POST /v1/jobs (multipart). The job: queued (202) or already completed (cached).

        The input is `image` (bytes or a file) or `image_url` (the gateway fetches it), not
        both. `wait_s=N` sends `Prefer: wait=N`: the gateway answers once the job ended (200,
        the final job) or after N seconds (at most its bound, 60 s by default; then the queued
        or running job, as without it). Without `idempotency_key` one is made for this call,
        so a retried submit (a lost reply, 503) can never queue the image twice.
        `progressive=True` (a full job): a quick preview-resolution result first, announced
        by a `preview_ready` event (`download(..., variant="quick")` saves its files)."""
        if (image is None) == (image_url is None):
            raise ValueError("submit takes an image or an image_url, exactly one of them")
        if image_url == "":
            raise ValueError("image_url must be a non-empty URL")
        headers = prefer_wait(wait_s)
        data = await asyncio.to_thread(image.read_bytes) if isinstance(image, Path) else image
        name = image.name if isinstance(image, Path) else "image"
        params: dict[str, Any] = {"quality": quality, "cache": cache}
        if webhook_url:
            params["webhook_url"] = webhook_url
        if webhook_events:
            params["webhook_events"] = list(webhook_events)
        if metadata:
            params["metadata"] = dict(metadata)
        if progressive:
            params["progressive"] = True  # sent only when on: older gateways refuse it
        encoded = orjson.dumps(params).decode()
        content_type = mimetypes.guess_type(name)[0] or "application/octet-stream"

        def form() -> aiohttp.FormData:
            f = aiohttp.FormData(default_to_multipart=True)
            if image_url is not None:
                f.add_field("image_url", image_url)
            else:
                f.add_field("image", data, filename=name, content_type=content_type)
            f.add_field("params", encoded, content_type="application/json")
            return f

        headers["Idempotency-Key"] = idempotency_key or f"splatq-client-{uuid.uuid4()}"
        # The gateway may hold the answer for wait_s: the request's time limit grows by as much.
        timeout = (
            aiohttp.ClientTimeout(total=(self._timeout.total or 0) + wait_s, connect=10)
            if wait_s and self._timeout.total is not None
            else None
        )
        return Job.from_json(
            await self._json(
                "POST", "/v1/jobs", safe=True, form=form, headers=headers, request_timeout=timeout
            )
        )

    async def submit_url(self, image_url: str, **params: Any) -> Job:
        """`submit(image_url=...)`: the gateway fetches the image (http or https, a public
        host unless it runs with SPLATQ_IMAGE_URL_ALLOW_PRIVATE)."""
        return await self.submit(image_url=image_url, **params)

    async def get(self, job_id: str) -> Job:
        return Job.from_json(await self._json("GET", f"/v1/jobs/{job_id}", safe=True))

    async def list_jobs(self, **query: Unpack[PageQuery]) -> JobPage:
        """One page of GET /v1/jobs: the caller's jobs, newest first. `status`: one or several
        (any of them); `created_since` inclusive, `created_until` exclusive (aware datetimes
        or RFC 3339 strings); `limit` 1..100 (gateway default 20); `cursor`: the previous
        page's `next_cursor`, with the same filters. `ValueError` for an unknown status or a
        naive datetime; `ApiProblem` 400 for what the gateway refuses."""
        params = list_query(**query)
        return JobPage.from_json(await self._json("GET", "/v1/jobs", safe=True, params=params))

    async def iter_jobs(self, **filters: Unpack[JobFilters]) -> AsyncGenerator[Job, None]:
        """Every job the filters (`list_jobs`'s) select, newest first, following
        `next_cursor` page by page (`limit` is the page size); stop iterating to stop reading."""
        cursor: str | None = None
        while True:
            page = await self.list_jobs(**filters, cursor=cursor)
            for job in page.items:
                yield job
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    async def cancel(self, job_id: str) -> Job:
        # Not repeated after a lost reply: a second cancel of a canceled job answers 409.
        return Job.from_json(await self._json("POST", f"/v1/jobs/{job_id}/cancel", safe=False))

    async def events(
        self, job_id: str, last_event_id: str | None = None
    ) -> AsyncGenerator[Event, None]:
        """The job's events (SSE) until its terminal event. A dropped stream is resumed with
        Last-Event-ID; `ApiProblem` after SSE_FAILURES_BEFORE_POLLING failures in a row, or
        at once when the gateway refuses the stream (4xx)."""
        last = last_event_id
        failures = 0
        while True:
            headers = {"Last-Event-ID": last} if last else {}
            timeout = aiohttp.ClientTimeout(total=None, sock_read=120, connect=10)
            try:
                async with self._http().get(
                    f"{self.base_url}/v1/jobs/{job_id}/events", headers=headers, timeout=timeout
                ) as resp:
                    if resp.status >= 400:
                        raise _problem(
                            resp.status, await resp.read(), resp.headers.get("Retry-After")
                        )
                    if resp.content_type != "text/event-stream":  # a proxy's answer, not SSE
                        raise ApiProblem(resp.status, "not_an_event_stream", resp.content_type)
                    async for event in parse_sse(resp.content):
                        last, failures = event.id or last, 0
                        yield event
                        if event.terminal:
                            return
                failure = ApiProblem(0, "stream_ended", "the event stream closed early")
            except ApiProblem as exc:
                if exc.status not in {502, 503, 504}:  # refused, or no SSE here: stop asking
                    raise
                failure = exc
            except (aiohttp.ClientError, TimeoutError) as exc:
                failure = ApiProblem(0, "unreachable", f"{type(exc).__name__}: {exc}")
            failures += 1
            if failures >= SSE_FAILURES_BEFORE_POLLING:
                raise failure
            await asyncio.sleep(self.retry.delay_s(1, None) or self.retry.base_s)

    async def wait(
        self,
        job_id: str,
        on_event: OnEvent | None = None,
        *,
        timeout_s: float | None = None,
        poll_interval_s: float = 1.0,
    ) -> Job:
        """Follow the job to its final state and return it (SSE, else polling). Raises
        `TimeoutError` after `timeout_s` (None: no limit); the job itself keeps running."""
        async with asyncio.timeout(timeout_s):
            try:
                async for event in self.events(job_id):
                    if on_event is not None:
                        on_event(event)
            except ApiProblem as exc:
                if exc.status in {401, 403, 404}:
                    raise
                return await self._poll(job_id, poll_interval_s)  # SSE refused or failing
            job = await self.get(job_id)
            return job if job.finished else await self._poll(job_id, poll_interval_s)

    async def _poll(self, job_id: str, interval_s: float) -> Job:
        while True:
            job = await self.get(job_id)
            if job.finished:
                return job
            await asyncio.sleep(interval_s)

    async def run(
        self,
        image: bytes | Path | None = None,
        *,
        on_event: OnEvent | None = None,
        timeout_s: float | None = None,
        poll_interval_s: float = 1.0,
        **submit: Any,
    ) -> Job:
        """Submit and wait: the job in its final state (completed, failed or canceled).
        `submit` takes `submit()`'s keywords (`image_url=`, `wait_s=`, ...); `TimeoutError`
        after `timeout_s`. A job that
        is final at once (a cache hit) is returned at once, or, with `on_event`, after its
        recorded events were replayed to it (the same callbacks either way)."""
        async with asyncio.timeout(timeout_s):
            job = await self.submit(image, **submit)
            if job.finished and on_event is None:
                return job
            return await self.wait(job.id, on_event, poll_interval_s=poll_interval_s)

    async def download(
        self, job_id: str, name: str, dest_dir: Path, *, variant: str | None = None
    ) -> Path:
        """Save one artifact (follows a presigned redirect); returns the file's path.
        `variant="quick"`: the progressive job's quick result, saved as `quick-<file>` so it
        never overwrites the full result's file in the same folder."""
        filename = ARTIFACT_FILES[name]
        dest = dest_dir / (f"{variant}-{filename}" if variant else filename)
        query = {"variant": variant} if variant else None
        path = f"/v1/jobs/{job_id}/artifacts/{name}"
        _, body = await self._request("GET", path, safe=True, params=query)
        await asyncio.to_thread(_write_atomically, dest, body)
        return dest


def _write_atomically(dest: Path, data: bytes) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".part")
    tmp.write_bytes(data)
    tmp.replace(dest)


def _problem(status: int, body: bytes, retry_after: str | None) -> ApiProblem:
    try:
        doc = orjson.loads(body)
        code, detail = str(doc.get("code", "http_error")), str(doc.get("detail", ""))
    except (orjson.JSONDecodeError, AttributeError):
        code, detail = "http_error", body[:200].decode(errors="replace")
    return ApiProblem(status, code, detail, parse_retry_after(retry_after))
