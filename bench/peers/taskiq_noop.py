"""taskiq peer adapter: enqueue, run and count the shared no-op workload via taskiq-redis streams.

Benchmark-only; it must not touch Redis keys other than its own stream and its autoclaim lock.
"""

from __future__ import annotations

import asyncio
import os
import sys
import weakref
from collections.abc import Awaitable, Callable
from importlib.metadata import version

from redis.asyncio import Redis, ResponseError
from taskiq_redis import RedisStreamBroker

NAME: str = f"taskiq {version('taskiq')} + taskiq-redis {version('taskiq-redis')} (stream broker)"

STREAM = "bench_taskiq_noop"
"""The broker's `queue_name`, i.e. the Redis stream key."""
GROUP = "bench_taskiq_noop"
"""The broker's `consumer_group_name`."""
TASK_NAME = "bench_taskiq_noop.noop"

ENV_REDIS_URL = "BENCH_TASKIQ_REDIS_URL"
"""How `python -m bench.peers.taskiq_noop` hands the URL to `broker_from_env` in the worker."""

_PRODUCERS = 64
"""Enqueue coroutines in flight (taskiq has no bulk kick: one XADD per message)."""

_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, Redis]] = (
    weakref.WeakKeyDictionary()
)


async def noop() -> None:
    """The no-op task: does nothing, returns None."""


def make_broker(redis_url: str) -> RedisStreamBroker:
    """A stream broker with library defaults (no result backend), the no-op task registered."""
    broker = RedisStreamBroker(redis_url, queue_name=STREAM, consumer_group_name=GROUP)
    broker.register_task(noop, task_name=TASK_NAME)
    return broker


def broker_from_env() -> RedisStreamBroker:
    """Broker factory for `taskiq worker bench.peers.taskiq_noop:broker_from_env`."""
    return make_broker(os.environ[ENV_REDIS_URL])


async def _run_bounded(n_jobs: int, make: Callable[[], Awaitable[object]]) -> None:
    """Await `make()` n_jobs times with at most `_PRODUCERS` in flight."""
    left = n_jobs

    async def producer() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await make()

    await asyncio.gather(*(producer() for _ in range(min(_PRODUCERS, n_jobs))))


async def enqueue(redis_url: str, n_jobs: int) -> None:
    """Enqueue n_jobs no-op jobs with `task.kiq()`, concurrently.

    `broker.startup()` declares the consumer group (at `$`) before the first XADD, which is what
    lets a worker started later receive these messages.
    """
    broker = make_broker(redis_url)
    task = broker.find_task(TASK_NAME)
    if task is None:
        raise RuntimeError(f"task {TASK_NAME} not registered")
    await broker.startup()
    try:
        await _run_bounded(n_jobs, task.kiq)
    finally:
        await broker.shutdown()


def worker_command(redis_url: str, concurrency: int) -> list[str]:
    """argv for one taskiq worker process; run it with cwd = repo root (no PYTHONPATH needed)."""
    return [sys.executable, "-m", "bench.peers.taskiq_noop", redis_url, str(concurrency)]


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
    """Jobs not acked yet: the group's lag (never delivered) + pending (delivered, not acked).

    One XINFO GROUPS. 0 when the stream does not exist; XLEN if the group does not exist yet.
    """
    client = _client(redis_url)
    try:
        groups: list[dict[str, object]] = await client.xinfo_groups(STREAM)
    except ResponseError as err:
        if "no such key" in str(err).lower():
            return 0
        raise
    for group in groups:
        name = group["name"]
        if (name.decode() if isinstance(name, bytes) else name) != GROUP:
            continue
        lag, pending = group["lag"], group["pending"]
        if not isinstance(lag, int) or not isinstance(pending, int):
            raise RuntimeError(f"XINFO GROUPS gave no usable lag/pending for {GROUP}: {group}")
        return lag + pending
    return int(await client.xlen(STREAM))


async def reset(redis_url: str) -> None:
    """Delete the stream (its consumer group goes with it) and the broker's autoclaim lock.

    Also closes the client `remaining()` cached for this event loop.
    """
    await _close_client(redis_url)
    async with Redis.from_url(redis_url) as client:
        await client.unlink(STREAM, f"autoclaim:{GROUP}:{STREAM}")


def _main(argv: list[str]) -> None:
    """`python -m bench.peers.taskiq_noop REDIS_URL CONCURRENCY`: `taskiq worker`, 1 process."""
    from taskiq.__main__ import main as taskiq_main  # noqa: PLC0415 - only the worker needs it

    redis_url, concurrency = argv
    os.environ[ENV_REDIS_URL] = redis_url
    sys.argv = [
        "taskiq",
        "worker",
        "bench.peers.taskiq_noop:broker_from_env",
        "--workers",
        "1",
        "--max-async-tasks",
        str(int(concurrency)),
        "--log-level",
        "WARNING",
    ]
    taskiq_main()


if __name__ == "__main__":
    _main(sys.argv[1:])
