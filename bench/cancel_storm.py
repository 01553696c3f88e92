"""A cancel storm against the fair feed: tenant A enqueues N previews and cancels them all
while they wait in its fair queue; then tenant B enqueues one preview. B's wait (created ->
started) on an idle worker is what the storm costs the other tenants (issue #21, item 6).

Usage: python -m bench.cancel_storm [--canceled 600 6000] [--concurrency 10]
       [--timeout-s 180] [--newest-first]

One redis-server and one `splatq worker` process (this module's handler: return at once) per
N. A's jobs are enqueued and canceled before the worker starts (so they wait, as behind a
busy fleet); B's job is enqueued once the worker has registered and gone idle (a blocking
read). Everything else is the real path: enqueue.lua, cancel.lua, take.lua's fair feed.
Also printed: the cancels' own rate (200 in flight) and Redis's time per LREM (the cancel's
scan of the tenant's queue); `--newest-first` cancels from the back of the queue, that
scan's worst case.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from redis.asyncio import Redis

from bench.processes import stop_process
from splatq.shared.engine.job_context import JobContext, JobHandler
from splatq.shared.engine.jobs import JobOutcome, JobSpec
from splatq.shared.engine.keys import StreamName
from splatq.shared.engine.queue import JobQueue
from splatq.shared.redis.client import connect
from splatq.shared.redis.server import RedisServer
from splatq.shared.settings import Settings

BATCH = 200


def make(settings: Settings) -> JobHandler:
    """The worker's handler: done at once."""

    async def handler(ctx: JobContext) -> JobOutcome:
        return JobOutcome()

    return handler


async def _idle_worker_registered(client: Redis, stream_key: str, group: str) -> None:
    """Return once the worker has read the stream (its consumer exists), then a little more so
    it sits in its blocking read (a bench's clock, not a test's)."""
    while True:
        consumers = await client.xinfo_consumers(stream_key, group)
        if consumers:
            await asyncio.sleep(0.3)
            return
        await asyncio.sleep(0.05)


async def _one(
    canceled: int, concurrency: int, timeout_s: float, newest_first: bool
) -> tuple[float, float, float]:
    """B's wait in ms (or the timeout, as a floor) after `canceled` canceled waiting jobs, the
    cancels' rate (per second) and Redis's time per LREM (µs)."""
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp), appendonly=False)
        await server.start()
        client = connect(server.url)
        settings = Settings(redis_url=server.url)
        queue = JobQueue(client, settings)
        await queue.setup()
        worker = None
        try:
            ids: list[str] = []
            for start in range(0, canceled, BATCH):
                batch = range(start, min(canceled, start + BATCH))
                replies = await asyncio.gather(
                    *(
                        queue.enqueue(JobSpec(tenant="A", quality="preview", metadata={"n": i}))
                        for i in batch
                    )
                )
                ids.extend(r.job_id for r in replies)
            if newest_first:
                ids.reverse()
            began = time.perf_counter()
            for start in range(0, canceled, BATCH):
                await asyncio.gather(*(queue.cancel(i) for i in ids[start : start + BATCH]))
            cancel_rate = canceled / (time.perf_counter() - began)
            # the withdrawal's scan of A's queue, as Redis timed it (commands run by scripts
            # count too): microseconds per LREM
            stats = await client.info("commandstats")
            lrem_us = float(stats.get("cmdstat_lrem", {}).get("usec_per_call", 0.0))
            env = {
                **os.environ,
                "SPLATQ_REDIS_URL": server.url,
                "SPLATQ_WORKER_CONCURRENCY": str(concurrency),
                "SPLATQ_LOG_LEVEL": "warning",
                "SPLATQ_LOG_FORMAT": "json",
            }
            worker = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "splatq.services.cli",
                "worker",
                "--handler",
                "bench.cancel_storm:make",
                env=env,
                stdout=asyncio.subprocess.DEVNULL,
                start_new_session=True,
            )
            stream_key = queue.keys.stream(0, StreamName.INTERACTIVE)
            await _idle_worker_registered(client, stream_key, queue.group)
            b = await queue.enqueue(JobSpec(tenant="B", quality="preview"))
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                job = await queue.get(b.job_id)
                assert job is not None
                if job.started_at_ms:
                    return float(job.started_at_ms - job.created_at_ms), cancel_rate, lrem_us
                await asyncio.sleep(0.005)
            return timeout_s * 1000, cancel_rate, lrem_us
        finally:
            if worker is not None:
                await stop_process(worker)
            await client.aclose()
            await server.stop()


async def run(args: argparse.Namespace) -> None:
    rows = []
    for n in args.canceled:
        wait_ms, rate, lrem_us = await _one(n, args.concurrency, args.timeout_s, args.newest_first)
        rows.append((n, wait_ms, rate, lrem_us))
        print(f"{n:>6} canceled ({rate:,.0f}/s): B waited {wait_ms:,.0f} ms", flush=True)
    order = "newest first" if args.newest_first else "oldest first"
    print()
    print(
        f"one worker of concurrency {args.concurrency}, idle; tenant A's previews enqueued and "
        f"canceled ({order}) while waiting, then one of tenant B's; "
        f"Python {platform.python_version()}"
    )
    print()
    print(
        "| canceled waiting jobs of A | B's wait on an idle worker (ms) | cancels/s |"
        " µs per LREM (in Redis) |"
    )
    print("|---:|---:|---:|---:|")
    for n, wait_ms, rate, lrem_us in rows:
        print(f"| {n:,} | {wait_ms:,.0f} | {rate:,.0f} | {lrem_us:,.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--canceled", type=int, nargs="+", default=[600, 6000])
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--timeout-s", type=float, default=180.0)
    parser.add_argument("--newest-first", action="store_true")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
