"""Mass redrive under live traffic: a dead-letter queue of N jobs is redriven by the redriver's
policy sweep (`splatq tasks run redrive_sweep`, its own process, rate-limited by the global
bucket) while live preview jobs arrive at a steady rate and one worker process runs every job
(no-op handler). Reports redrives/s and the live jobs' p99 time-to-start (created -> started)
during the mass redrive divided by the same p99 with no redrive running (target <= 2x).

Usage: python -m bench.redrive [--entries 100000] [--rate 1000] [--live-per-s 20]

The dead letters are jobs enqueued by `JobQueue.enqueue`, then marked failed and written to the
dead-letter stream the way reclaim.lua does (one pipeline), to build 100,000 in seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from splatq.shared.engine.jobs import JobSpec
from splatq.shared.engine.keys import STREAMS, StreamName
from splatq.shared.engine.queue import JobQueue
from splatq.shared.redis.client import connect
from splatq.shared.redis.server import RedisServer
from splatq.shared.settings import Settings

POLICY = """
[rate_limit]
per_s = {rate}
burst = {burst}

[sweep]
batch = {batch}

[[policies]]
name = "mass-redrive"
kind = "jobs"
codes = ["max_deliveries_exceeded"]
action = "redrive"
budget = 1
"""


def _env(redis_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPLATQ_")}
    env.update(SPLATQ_REDIS_URL=redis_url, SPLATQ_LOG_LEVEL="warning", SPLATQ_LOG_FORMAT="json",
               SPLATQ_FETCH_BLOCK_MS="100", **extra)  # fmt: skip
    return env


async def build_dead_letters(queue: JobQueue, n: int) -> None:
    spec = JobSpec(tenant="bench-dlq", quality="preview")
    done = 0
    while done < n:
        batch = min(500, n - done)
        ids = [r.job_id for r in await asyncio.gather(*(queue.enqueue(spec) for _ in range(batch)))]
        pipe = queue.redis.pipeline(transaction=False)
        now = int(time.time() * 1000)
        for job_id in ids:
            pipe.hset(queue.keys.job(job_id), mapping={"status": "failed", "stage": "dead_lettered",
                      "error_code": "dead_lettered", "completed_at_ms": now})  # fmt: skip
            pipe.xadd(queue.keys.dead_letters(0), {"job": job_id, "stream": "interactive",
                      "reason": "max_deliveries_exceeded", "at_ms": str(now)})  # fmt: skip
        await pipe.execute()
        done += batch
    for stream in STREAMS:  # their original entries: gone, as after a dead letter
        await queue.redis.delete(queue.keys.stream(0, stream))
    await queue.setup()


async def live_traffic(queue: JobQueue, per_s: float, seconds: float) -> list[float]:
    """Enqueue preview jobs at `per_s` for `seconds`; their time-to-start in ms."""
    spec = JobSpec(tenant="live", quality="preview")
    ids: list[str] = []
    start = time.monotonic()
    while (elapsed := time.monotonic() - start) < seconds:
        ids.append((await queue.enqueue(spec)).job_id)
        await asyncio.sleep(max(0.0, len(ids) / per_s - elapsed))
    waits: list[float] = []
    deadline = time.monotonic() + 60
    for job_id in ids:
        while True:
            job = await queue.get(job_id)
            if job is not None and job.started_at_ms:
                waits.append(job.started_at_ms - job.created_at_ms)
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"live job {job_id} never started")
            await asyncio.sleep(0.05)
    return waits


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98] if len(values) > 1 else values[0]


async def run(entries: int, rate: float, live_per_s: float, idle_s: float) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp) / "redis", appendonly=False)
        await server.start()
        client = connect(server.url)
        settings = Settings(redis_url=server.url)
        queue = JobQueue(client, settings)
        await queue.setup()
        t0 = time.monotonic()
        await build_dead_letters(queue, entries)
        print(f"built {entries:,} dead letters in {time.monotonic() - t0:.1f} s", flush=True)
        worker = subprocess.Popen(  # noqa: ASYNC220 - started once, killed at the end
            [sys.executable, "-m", "splatq.services.cli", "worker", "--handler",
             "bench.peers.splatq_noop:make"],
            env=_env(server.url, SPLATQ_WORKER_CONCURRENCY="32"),
        )  # fmt: skip
        try:
            await live_traffic(queue, live_per_s, 2.0)  # warm-up: the worker is up
            idle = await live_traffic(queue, live_per_s, idle_s)
            config = Path(tmp) / "redriver.toml"
            config.write_text(POLICY.format(rate=rate, burst=max(1, int(rate / 10)), batch=500))
            started = time.monotonic()
            sweep = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "splatq.services.cli", "tasks", "run", "redrive_sweep",
                env=_env(server.url, SPLATQ_REDRIVER_CONFIG=str(config)),
                stdout=asyncio.subprocess.PIPE,
            )  # fmt: skip
            during: list[float] = []
            while (await client.xlen(queue.keys.dead_letters(0))) > entries * 0.05:
                during += await live_traffic(queue, live_per_s, 2.0)
            out, _ = await sweep.communicate()
            duration = time.monotonic() - started
            left = await client.xlen(queue.keys.dead_letters(0))
            backlog = await client.xlen(queue.keys.stream(0, StreamName.INTERACTIVE))
        finally:
            worker.kill()
            worker.wait()
            await client.aclose()
            await server.stop()
    redriven = entries - left
    print(out.decode().strip())
    print(
        f"\n{entries:,} dead letters (preview jobs: the live jobs' own stream), rate limit "
        f"{rate:,.0f}/s, live preview jobs {live_per_s:.0f}/s, one worker process (concurrency "
        f"32, no-op handler), Python {platform.python_version()}, {os.cpu_count()} CPUs\n"
    )
    print("| measure | value |\n|---|---|")
    print(f"| redriven | {redriven:,} in {duration:.1f} s |")
    print(f"| redrives/s | {redriven / duration:,.0f} |")
    print(f"| live p99 time-to-start, idle | {p99(idle):.1f} ms ({len(idle)} jobs) |")
    busy = f"{p99(during):.1f} ms ({len(during)} jobs)"
    print(f"| live p99 time-to-start, during the redrive | {busy} |")
    print(f"| ratio (target <= 2x) | {p99(during) / p99(idle):.2f}x |")
    print(f"| interactive backlog at the end | {backlog} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--entries", type=int, default=100_000)
    p.add_argument("--rate", type=float, default=1000.0, help="redrive rate limit per second")
    p.add_argument("--live-per-s", type=float, default=20.0)
    p.add_argument("--idle-s", type=float, default=10.0)
    a = p.parse_args()
    asyncio.run(run(a.entries, a.rate, a.live_per_s, a.idle_s))


if __name__ == "__main__":
    main()
