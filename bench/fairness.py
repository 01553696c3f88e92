"""Tenant fairness: tenant A floods the synthesis stream, then tenant B submits spaced jobs;
B's queue wait (created -> started) with fair scheduling and, in the same run, with plain
arrival order.

Usage: python -m bench.fairness [--flood 2000] [--spaced 20] [--service-ms 50]
       [--concurrency 10] [--rounds 1]

One redis-server and one `splatq worker` process (this module's handler: sleep for the
service time, then a result) per mode. Everything else is the real path: enqueue.lua,
take.lua's fair feed, leases, finish.lua.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.processes import stop_process
from splatq.shared.engine.job_context import JobContext, JobHandler
from splatq.shared.engine.jobs import JobOutcome, JobSpec
from splatq.shared.engine.keys import STREAMS
from splatq.shared.engine.queue import JobQueue
from splatq.shared.redis.client import connect
from splatq.shared.redis.server import RedisServer
from splatq.shared.settings import Settings

SERVICE_ENV = "BENCH_FAIRNESS_SERVICE_MS"


def make(settings: Settings) -> JobHandler:
    """The worker's handler: one job takes the service time (sleep), nothing else."""
    service_s = int(os.environ.get(SERVICE_ENV, "50")) / 1000.0

    async def handler(ctx: JobContext) -> JobOutcome:
        await asyncio.sleep(service_s)
        return JobOutcome()

    return handler


async def _drained(queue: JobQueue) -> None:
    """Return once no job waits or runs (polled: the bench's clock, not a test's)."""
    while True:
        if sum([(await queue.waiting(0, s)).in_line for s in STREAMS]) == 0:
            return
        await asyncio.sleep(0.05)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def _one_mode(args: argparse.Namespace, fair: bool) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp), appendonly=False)
        await server.start()
        client = connect(server.url)
        settings = Settings(redis_url=server.url, fair_scheduling=fair)
        queue = JobQueue(client, settings)
        await queue.setup()
        env = {
            **os.environ,
            "SPLATQ_REDIS_URL": server.url,
            "SPLATQ_FAIR_SCHEDULING": str(int(fair)),
            "SPLATQ_WORKER_CONCURRENCY": str(args.concurrency),
            "SPLATQ_LOG_LEVEL": "warning",
            "SPLATQ_LOG_FORMAT": "json",
            SERVICE_ENV: str(args.service_ms),
        }
        worker = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "splatq.services.cli",
            "worker",
            "--handler",
            "bench.fairness:make",
            env=env,
            stdout=asyncio.subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            flood = [
                await queue.enqueue(JobSpec(tenant="A", quality="full", metadata={"n": i}))
                for i in range(args.flood)
            ]
            started = time.monotonic()
            spaced = []
            for i in range(args.spaced):
                spaced.append(
                    await queue.enqueue(JobSpec(tenant="B", quality="full", metadata={"n": i}))
                )
                await asyncio.sleep(args.spacing_ms / 1000.0)
            ids = [r.job_id for r in flood + spaced]
            await _drained(queue)
            elapsed = time.monotonic() - started
            waits = []
            for r in spaced:
                job = await queue.get(r.job_id)
                assert job is not None
                assert job.status.value == "completed", job.status
                waits.append((job.started_at_ms or 0) - job.created_at_ms)
            done = 0
            for job_id in ids:
                job = await queue.get(job_id)
                done += job is not None and job.status.value == "completed"
            return {
                "p50": _pct(waits, 0.5),
                "p99": _pct(waits, 0.99),
                "max": max(waits),
                "completed": done,
                "jobs_per_s": len(ids) / elapsed if elapsed else 0.0,
            }
        finally:
            await stop_process(worker)
            await client.aclose()
            await server.stop()


async def run(args: argparse.Namespace) -> None:
    results: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    for r in range(args.rounds):
        for fair in (True, False):
            m = await _one_mode(args, fair)
            results[fair].append(m)
            label = "fair" if fair else "arrival order"
            print(
                f"round {r + 1} {label:<14} B wait p50 {m['p50']:>7.0f} ms  p99 {m['p99']:>7.0f}"
                f" ms  ({m['completed']:.0f} completed, {m['jobs_per_s']:.0f} jobs/s)"
            )
    print()
    print(
        f"tenant A: {args.flood} synthesis jobs, then tenant B: {args.spaced} jobs every "
        f"{args.spacing_ms} ms; service time {args.service_ms} ms, one worker of concurrency "
        f"{args.concurrency}; {args.rounds} round(s); Python {platform.python_version()}"
    )
    print()
    print("| scheduling | B wait p50 (ms) | B wait p99 (ms) | B wait max (ms) | drain jobs/s |")
    print("|---|---:|---:|---:|---:|")
    for fair in (True, False):
        ms = results[fair]
        row = [statistics.median(m[k] for m in ms) for k in ("p50", "p99", "max", "jobs_per_s")]
        name = "fair (DRR)" if fair else "arrival order"
        print(f"| {name} | {row[0]:,.0f} | {row[1]:,.0f} | {row[2]:,.0f} | {row[3]:,.0f} |")
    fair_p99 = statistics.median(m["p99"] for m in results[True])
    fifo_p99 = statistics.median(m["p99"] for m in results[False])
    print()
    print(f"B's p99 wait, arrival order / fair: {fifo_p99 / max(fair_p99, 1.0):,.1f}x")
    print(f"B's p99 wait in service times (fair): {fair_p99 / args.service_ms:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flood", type=int, default=2000)
    parser.add_argument("--spaced", type=int, default=20)
    parser.add_argument("--spacing-ms", type=int, default=200)
    parser.add_argument("--service-ms", type=int, default=50)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=1)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
