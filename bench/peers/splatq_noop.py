"""splatq adapter for the peer benchmark: the same no-op workload through splatq's engine.

Benchmark-only; it uses the public engine API (JobQueue, `splatq worker`) and nothing private.
The path measured is the full one: start.lua (lease + processing + started event), the no-op
handler, finish.lua (completed + completed event + XACK + XDEL), heartbeats and reaper on.
"""

from __future__ import annotations

import asyncio
import sys
from importlib.metadata import version

from splatq.shared.engine.job_context import JobContext, JobHandler
from splatq.shared.engine.jobs import JobOutcome, JobSpec
from splatq.shared.engine.keys import STREAMS
from splatq.shared.engine.queue import JobQueue
from splatq.shared.redis.client import connect
from splatq.shared.settings import Settings

NAME: str = f"splatq {version('splatq')}"
_PRODUCERS = 64
# Jobs come from this many tenants in turn, so fair scheduling (on by default) has a ring of
# tenants to serve, as in production; `splatq_fifo_noop` runs the same with it off.
TENANTS = 8
_EMPTY = JobOutcome()


async def noop(ctx: JobContext) -> JobOutcome:
    """The no-op job: nothing to compute, no artifacts."""
    return _EMPTY


def make(settings: Settings) -> JobHandler:
    return noop


def _settings(redis_url: str, fair: bool = True) -> Settings:
    return Settings(redis_url=redis_url, fair_scheduling=fair)


async def enqueue(redis_url: str, n_jobs: int, fair: bool = True) -> None:
    """Enqueue n_jobs preview (interactive) jobs of TENANTS tenants, `_PRODUCERS` in flight."""
    client = connect(redis_url)
    queue = JobQueue(client, _settings(redis_url, fair))
    await queue.setup()
    left = n_jobs
    specs = [JobSpec(tenant=f"bench-{i}", quality="preview") for i in range(TENANTS)]

    async def producer() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await queue.enqueue(specs[left % TENANTS])

    try:
        await asyncio.gather(*(producer() for _ in range(min(_PRODUCERS, n_jobs))))
    finally:
        await client.aclose()


def worker_command(
    redis_url: str,
    concurrency: int,
    fair: bool = True,
    runs: tuple[str, ...] = ("--handler", "bench.peers.splatq_noop:make"),
    extra: tuple[str, ...] = (),
) -> list[str]:
    """One `splatq worker` process running `runs` (its handler options); its settings
    travel as SPLATQ_* variables via env(1), `extra` ('NAME=value') among them."""
    return [
        "env",
        f"SPLATQ_REDIS_URL={redis_url}",
        f"SPLATQ_FAIR_SCHEDULING={int(fair)}",
        f"SPLATQ_WORKER_CONCURRENCY={concurrency}",
        *extra,
        "SPLATQ_LOG_LEVEL=warning",
        "SPLATQ_LOG_FORMAT=json",
        sys.executable,
        "-m",
        "splatq.services.cli",
        "worker",
        *runs,
    ]


async def remaining(redis_url: str) -> int:
    """Jobs not finished: entries still in the work streams (finish.lua XDELs an entry in the
    commit itself) and jobs still waiting in the tenants' fair queues."""
    client = connect(redis_url)
    try:
        queue = JobQueue(client, _settings(redis_url))
        return sum([(await queue.waiting(0, stream)).in_line for stream in STREAMS])
    finally:
        await client.aclose()


async def reset(redis_url: str) -> None:
    """Delete every splatq key (the benchmark's Redis is its own)."""
    client = connect(redis_url)
    try:
        keys = [k async for k in client.scan_iter(match="splatq:*", count=1000)]
        for i in range(0, len(keys), 500):
            await client.unlink(*keys[i : i + 500])
    finally:
        await client.aclose()
