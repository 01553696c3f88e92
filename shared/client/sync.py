"""`SyncSplatqClient`: the blocking client for scripts and notebooks.

It runs `SplatqClient` on a private event loop in its own daemon thread and waits for each
call there, so it works the same with or without a running loop in the caller's thread
(Jupyter, or a sync function called from async code): it never runs the caller's loop nor
nests one in it; like any blocking call, it holds the calling thread until the answer comes.
`on_event` callbacks run on the private thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator, Awaitable, Iterator
from pathlib import Path
from typing import Any, TypeVar, Unpack

from splatq.shared.client.aio import OnEvent, SplatqClient
from splatq.shared.client.query import JobFilters, PageQuery
from splatq.shared.client.retry import RetryPolicy
from splatq.shared.client.types import Event, Job, JobPage

T = TypeVar("T")


class SyncSplatqClient:
    """Blocking client: `with SyncSplatqClient(url, key) as c: job = c.run(path)`."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        timeout_s: float = 60.0,
        retry: RetryPolicy | None = None,
    ) -> None:
        self._client = SplatqClient(base_url, api_key, timeout_s, retry)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="splatq-client", daemon=True
        )
        self._thread.start()
        self._closed = False

    def __enter__(self) -> SyncSplatqClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, aw: Awaitable[T]) -> T:
        refusal = (
            "the client is closed"
            if self._closed
            else "SyncSplatqClient called from its own event loop (inside on_event?)"
            if threading.current_thread() is self._thread
            else ""
        )
        if refusal:
            if asyncio.iscoroutine(aw):
                aw.close()
            raise RuntimeError(refusal)
        return asyncio.run_coroutine_threadsafe(_await(aw), self._loop).result()

    def submit(self, image: bytes | Path | None = None, **params: Any) -> Job:
        """See `SplatqClient.submit` (`image_url=`, `wait_s=`, ...)."""
        return self._run(self._client.submit(image, **params))

    def submit_url(self, image_url: str, **params: Any) -> Job:
        return self._run(self._client.submit_url(image_url, **params))

    def list_jobs(self, **query: Unpack[PageQuery]) -> JobPage:
        """One page of the caller's jobs (see `SplatqClient.list_jobs`)."""
        return self._run(self._client.list_jobs(**query))

    def iter_jobs(self, **filters: Unpack[JobFilters]) -> Iterator[Job]:
        """Every job the filters select, newest first, page by page (a plain generator)."""
        return self._iterate(self._client.iter_jobs(**filters))

    def get(self, job_id: str) -> Job:
        return self._run(self._client.get(job_id))

    def cancel(self, job_id: str) -> Job:
        return self._run(self._client.cancel(job_id))

    def wait(
        self,
        job_id: str,
        on_event: OnEvent | None = None,
        *,
        timeout_s: float | None = None,
        poll_interval_s: float = 1.0,
    ) -> Job:
        return self._run(
            self._client.wait(
                job_id, on_event, timeout_s=timeout_s, poll_interval_s=poll_interval_s
            )
        )

    def run(self, image: bytes | Path | None = None, **kw: Any) -> Job:
        """Submit and wait (see `SplatqClient.run`)."""
        return self._run(self._client.run(image, **kw))

    def events(self, job_id: str, last_event_id: str | None = None) -> Iterator[Event]:
        """The job's events, one at a time, until its terminal event."""
        return self._iterate(self._client.events(job_id, last_event_id))

    def _iterate(self, stream: AsyncGenerator[T, None]) -> Iterator[T]:
        """An async generator of the private loop, one item per `next()`; closed there when
        the caller stops early."""
        try:
            while True:
                try:
                    yield self._run(anext(stream))
                except StopAsyncIteration:
                    return
        finally:
            if not self._closed:
                self._run(stream.aclose())

    def download(
        self, job_id: str, name: str, dest_dir: Path, *, variant: str | None = None
    ) -> Path:
        return self._run(self._client.download(job_id, name, dest_dir, variant=variant))

    def close(self) -> None:
        if self._closed:
            return
        self._run(self._client.close())
        self._closed = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


async def _await(aw: Awaitable[T]) -> T:
    return await aw
