"""SAQ peer adapter: enqueue, run and count the shared no-op workload through SAQ on Redis.

Benchmark-only; it must not touch Redis keys other than its own SAQ queue's (see `reset`).
"""

from __future__ import annotations

import asyncio
import os
import sys
import weakref
from collections.abc import Awaitable, Callable
from importlib.metadata import version

from redis.asyncio import Redis
from saq import Queue
from saq.types import Context, SettingsDict

NAME: str = f"saq {version('saq')}"

QUEUE_NAME = "bench_saq_noop"
"""SAQ queue name; every key SAQ writes for it starts with `saq:<name>:` or `saq:job:<name>:`."""

ENV_REDIS_URL = "BENCH_SAQ_REDIS_URL"
ENV_CONCURRENCY = "BENCH_SAQ_CONCURRENCY"
"""How `python -m bench.peers.saq_noop` hands its argv to `settings()` inside the SAQ CLI."""

_PRODUCERS = 64
"""Enqueue coroutines in flight; SAQ itself caps concurrent enqueues at `max_concurrent_ops`."""

_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, Redis]] = (
    weakref.WeakKeyDictionary()
)


async def noop(ctx: Context) -> None:
    """The no-op task: does nothing, returns None."""


def settings() -> SettingsDict[Context]:
    """SAQ worker settings (the CLI calls this), configured from the environment by `_main`."""
    return {
        "queue": Queue.from_url(os.environ[ENV_REDIS_URL], name=QUEUE_NAME),
        "functions": [noop],
        "concurrency": int(os.environ[ENV_CONCURRENCY]),
    }


async def _run_bounded(n_jobs: int, make: Callable[[], Awaitable[object]]) -> list[object]:
    """Await `make()` n_jobs times with at most `_PRODUCERS` in flight; results in any order."""
    results: list[object] = []
    left = n_jobs

    async def producer() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            results.append(await make())

    await asyncio.gather(*(producer() for _ in range(min(_PRODUCERS, n_jobs))))
    return results


async def enqueue(redis_url: str, n_jobs: int) -> None:
    """Enqueue n_jobs no-op jobs (SAQ has no bulk enqueue: one EVALSHA each, run concurrently)."""
    queue = Queue.from_url(redis_url, name=QUEUE_NAME)
    await queue.connect()
    try:
        jobs = await _run_bounded(n_jobs, lambda: queue.enqueue("noop"))
    finally:
        await queue.disconnect()
    if any(job is None for job in jobs):
        raise RuntimeError("SAQ refused an enqueue (duplicate job key)")


def worker_command(redis_url: str, concurrency: int) -> list[str]:
    """argv for one SAQ worker process; run it with cwd = repo root (no PYTHONPATH needed)."""
    return [sys.executable, "-m", "bench.peers.saq_noop", redis_url, str(concurrency)]


def _client(redis_url: str) -> Redis:
    """One Redis client per (event loop, url), reused by `remaining()` polls; `reset` closes it."""
    per_loop = _clients.setdefault(asyncio.get_running_loop(), {})
    client = per_loop.get(redis_url)
    if client is None:
        client = per_loop[redis_url] = Redis.from_url(redis_url)
    return client


async def _close_client(redis_url: str) -> None:
    """Close the cached `remaining()` client of this loop, if any (so no socket outlives a run)."""
    client = _clients.get(asyncio.get_running_loop(), {}).pop(redis_url, None)
    if client is not None:
        await client.aclose()


async def remaining(redis_url: str) -> int:
    """Jobs not finished yet: LLEN of SAQ's queued + active lists, in one round trip."""
    async with _client(redis_url).pipeline(transaction=False) as pipe:
        pipe.llen(f"saq:{QUEUE_NAME}:queued")
        pipe.llen(f"saq:{QUEUE_NAME}:active")
        queued, active = await pipe.execute()
    return int(queued) + int(active)


async def reset(redis_url: str) -> None:
    """Delete every key of this adapter's SAQ queue, and the abort markers of its jobs.

    Queue keys are `saq:<queue>:*` (lists, sets, worker info); job records are
    `saq:job:<queue>:<key>`; SAQ's sweep may leave `saq:abort:<key>` (5 s TTL) for one of them.
    Also closes the client `remaining()` cached for this event loop.
    """
    await _close_client(redis_url)
    job_prefix = f"saq:job:{QUEUE_NAME}:"
    async with Redis.from_url(redis_url) as client:
        for pattern in (f"saq:{QUEUE_NAME}:*", f"{job_prefix}*"):
            batch: list[bytes | str] = []
            async for key in client.scan_iter(match=pattern, count=1000):
                batch.append(key)
                if key.startswith(job_prefix.encode()):
                    batch.append(f"saq:abort:{key[len(job_prefix) :].decode()}")
                if len(batch) >= 1000:
                    await client.unlink(*batch)
                    batch.clear()
            if batch:
                await client.unlink(*batch)


def _main(argv: list[str]) -> None:
    """`python -m bench.peers.saq_noop REDIS_URL CONCURRENCY`: SAQ's own CLI, warning-level logs."""
    from saq.__main__ import main as saq_main  # noqa: PLC0415 - only the worker process needs it

    redis_url, concurrency = argv
    os.environ[ENV_REDIS_URL] = redis_url
    os.environ[ENV_CONCURRENCY] = str(int(concurrency))
    # Same as running `saq bench.peers.saq_noop.settings` (verbosity 0 = WARNING).
    sys.argv = ["saq", "bench.peers.saq_noop.settings"]
    saq_main()


if __name__ == "__main__":
    _main(sys.argv[1:])
