"""A small typed client for the splatq HTTP API (async `SplatqClient`, sync `SyncSplatqClient`).

HTTP only, no engine imports: what a user's program or the `splatq` CLI uses to talk to a
gateway. API errors surface as `ApiProblem` with the contract's stable `code`.
"""

from __future__ import annotations

import asyncio
import mimetypes
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import orjson

from splatq.shared.engine.events import TERMINAL_EVENTS
from splatq.shared.storage.store import ARTIFACT_FILES

T = TypeVar("T")


class ApiProblem(Exception):
    """The gateway refused or failed a request (problem+json), or could not be reached."""

    def __init__(self, status: int, code: str, detail: str, retry_after: float | None = None):
        super().__init__(f"{status} {code}: {detail}")
        self.status = status
        self.code = code
        self.detail = detail
        self.retry_after = retry_after


@dataclass(frozen=True, slots=True)
class Event:
    id: str
    name: str
    payload: Mapping[str, Any]


class SplatqClient:
    """Async client. Use as `async with SplatqClient(url, key) as c:`."""

    def __init__(self, base_url: str, api_key: str, timeout_s: float = 60.0) -> None:
        self.base_url = base_url.rstrip("/")
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

    async def _call(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        try:
            async with self._http().request(method, self.base_url + path, **kw) as resp:
                body = await resp.read()
                if resp.status >= 400:
                    raise _problem(resp.status, body, resp.headers.get("Retry-After"))
                data: dict[str, Any] = orjson.loads(body)
                return data
        except aiohttp.ClientError as exc:
            raise ApiProblem(0, "unreachable", f"{type(exc).__name__}: {exc}") from exc

    async def submit(
        self,
        image: bytes | Path,
        *,
        quality: str = "full",
        webhook_url: str | None = None,
        webhook_events: list[str] | None = None,
        metadata: Mapping[str, Any] | None = None,
        cache: bool = True,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """POST /v1/jobs (multipart). Returns the job (202 queued, or 200 cached)."""
        data = await asyncio.to_thread(image.read_bytes) if isinstance(image, Path) else image
        name = image.name if isinstance(image, Path) else "image"
        params: dict[str, Any] = {"quality": quality, "cache": cache}
        if webhook_url:
            params["webhook_url"] = webhook_url
        if webhook_events:
            params["webhook_events"] = webhook_events
        if metadata:
            params["metadata"] = dict(metadata)
        form = aiohttp.FormData()
        form.add_field(
            "image",
            data,
            filename=name,
            content_type=mimetypes.guess_type(name)[0] or "application/octet-stream",
        )
        form.add_field("params", orjson.dumps(params).decode(), content_type="application/json")
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        return await self._call("POST", "/v1/jobs", data=form, headers=headers)

    async def get(self, job_id: str) -> dict[str, Any]:
        return await self._call("GET", f"/v1/jobs/{job_id}")

    async def cancel(self, job_id: str) -> dict[str, Any]:
        return await self._call("POST", f"/v1/jobs/{job_id}/cancel")

    async def events(self, job_id: str, last_event_id: str | None = None) -> AsyncIterator[Event]:
        """The job's events (SSE) until its terminal event; reconnects with Last-Event-ID."""
        last = last_event_id
        while True:
            headers = {"Last-Event-ID": last} if last else {}
            timeout = aiohttp.ClientTimeout(total=None, sock_read=120, connect=10)
            try:
                async with self._http().get(
                    f"{self.base_url}/v1/jobs/{job_id}/events", headers=headers, timeout=timeout
                ) as resp:
                    if resp.status >= 400:
                        raise _problem(resp.status, await resp.read(), None)
                    async for event in _parse_sse(resp.content):
                        last = event.id
                        yield event
                        if event.name in TERMINAL_EVENTS:
                            return
            except (TimeoutError, aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError):
                await asyncio.sleep(1)  # resume after the last event we saw

    async def wait(
        self, job_id: str, on_event: Callable[[Event], None] | None = None
    ) -> dict[str, Any]:
        """Follow the job's events to the end; returns the final job."""
        async for event in self.events(job_id):
            if on_event is not None:
                on_event(event)
        return await self.get(job_id)

    async def download(self, job_id: str, name: str, dest_dir: Path) -> Path:
        """Save one artifact (follows a presigned redirect); returns the file's path."""
        dest = dest_dir / ARTIFACT_FILES[name]
        try:
            async with self._http().get(
                f"{self.base_url}/v1/jobs/{job_id}/artifacts/{name}"
            ) as resp:
                if resp.status >= 400:
                    raise _problem(resp.status, await resp.read(), None)
                body = await resp.read()
            await asyncio.to_thread(_write_atomically, dest, body)
        except aiohttp.ClientError as exc:
            raise ApiProblem(0, "unreachable", f"{type(exc).__name__}: {exc}") from exc
        return dest


def _write_atomically(dest: Path, data: bytes) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".part")
    tmp.write_bytes(data)
    tmp.replace(dest)


async def _parse_sse(stream: aiohttp.StreamReader) -> AsyncIterator[Event]:
    fields: dict[str, str] = {}
    async for raw in stream:
        line = raw.decode().rstrip("\r\n")
        if not line:
            if "data" in fields:
                yield Event(
                    fields.get("id", ""),
                    fields.get("event", "message"),
                    orjson.loads(fields["data"]),
                )
            fields = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")


def _problem(status: int, body: bytes, retry_after: str | None) -> ApiProblem:
    try:
        doc = orjson.loads(body)
        code, detail = str(doc.get("code", "http_error")), str(doc.get("detail", ""))
    except (orjson.JSONDecodeError, AttributeError):
        code, detail = "http_error", body[:200].decode(errors="replace")
    after = float(retry_after) if retry_after and retry_after.isdigit() else None
    return ApiProblem(status, code, detail, after)


class SyncSplatqClient:
    """Blocking wrapper for scripts and notebooks (runs its own event loop)."""

    def __init__(self, base_url: str, api_key: str, timeout_s: float = 60.0) -> None:
        self._loop = asyncio.new_event_loop()
        self._client = SplatqClient(base_url, api_key, timeout_s)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._loop.run_until_complete(coro)

    def submit(self, image: bytes | Path, **params: Any) -> dict[str, Any]:
        return self._run(self._client.submit(image, **params))

    def get(self, job_id: str) -> dict[str, Any]:
        return self._run(self._client.get(job_id))

    def cancel(self, job_id: str) -> dict[str, Any]:
        return self._run(self._client.cancel(job_id))

    def wait(self, job_id: str, on_event: Callable[[Event], None] | None = None) -> dict[str, Any]:
        return self._run(self._client.wait(job_id, on_event))

    def download(self, job_id: str, name: str, dest_dir: Path) -> Path:
        return self._run(self._client.download(job_id, name, dest_dir))

    def close(self) -> None:
        self._run(self._client.close())
        self._loop.close()
