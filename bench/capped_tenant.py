"""A capped tenant on an otherwise idle worker: tenant A, capped at `--cap` running jobs per
stream, submits `--jobs` quick jobs; its throughput against the cap's own bound
(cap / service time), and the gap between a job's commit and the start of the next.

Usage: python -m bench.capped_tenant [--jobs 200] [--cap 2] [--service-ms 10]
       [--concurrency 8] [--rounds 1]

One redis-server and one `splatq worker` process (bench/fairness.py's handler: sleep for the
service time) with the shipped defaults, the cap set by SPLATQ_TENANT_MAX_RUNNING_SYNTHESIS.
The worker has more slots than the cap, so it sits in its blocking read
(SPLATQ_FETCH_BLOCK_MS) whenever A's running jobs hold the cap: what makes A's next job ready
when one of them commits is the subject.
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

from bench.fairness import SERVICE_ENV, _drained
from bench.processes import stop_process
from splatq.shared.engine.fairness import TenantPolicy
from splatq.shared.engine.jobs import JobSpec
from splatq.shared.engine.queue import JobQueue
from splatq.shared.redis.client import connect
from splatq.shared.redis.server import RedisServer
from splatq.shared.settings import Settings


async def _one_round(args: argparse.Namespace) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp), appendonly=False)
        await server.start()
        client = connect(server.url)
        queue = JobQueue(client, Settings(redis_url=server.url))
        await queue.setup()
        env = {
            **os.environ,
            "SPLATQ_REDIS_URL": server.url,
            "SPLATQ_WORKER_CONCURRENCY": str(args.concurrency),
            "SPLATQ_TENANT_MAX_RUNNING_SYNTHESIS": str(args.cap),
            "SPLATQ_LOG_LEVEL": "warning",
            "SPLATQ_LOG_FORMAT": "json",
            SERVICE_ENV: str(args.service_ms),
        }
        worker = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "splatq.services.cli", "worker",
            "--handler", "bench.fairness:make",
            env=env, stdout=asyncio.subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        try:
            await asyncio.sleep(2.0)  # the worker up and idle in its blocking read
            policy = TenantPolicy(max_running=args.cap)
            started = time.monotonic()
            ids = [
                (await queue.enqueue(
                    JobSpec(tenant="A", quality="full", metadata={"n": i}), policy=policy
                )).job_id
                for i in range(args.jobs)
            ]  # fmt: skip
            await _drained(queue)
            elapsed = time.monotonic() - started
            spans = []
            for job_id in ids:
                job = await queue.get(job_id)
                assert job is not None, job_id
                assert job.status.value == "completed", job_id
                spans.append((job.started_at_ms or 0, job.completed_at_ms or 0))
            # The gap before each start: from the latest commit before it, if the cap was
            # full until then (the first `cap` jobs start at once).
            starts = sorted(s for s, _ in spans)
            ends = sorted(e for _, e in spans)
            gaps = []
            for start in starts[args.cap :]:
                before = [e for e in ends if e <= start]
                if before:
                    gaps.append(start - before[-1])
            return {
                "jobs_per_s": args.jobs / elapsed,
                "gap_p50": statistics.median(gaps) if gaps else 0.0,
                "gap_max": max(gaps) if gaps else 0.0,
            }
        finally:
            await stop_process(worker)
            await client.aclose()
            await server.stop()


async def run(args: argparse.Namespace) -> None:
    rounds = []
    for r in range(args.rounds):
        m = await _one_round(args)
        rounds.append(m)
        print(
            f"round {r + 1}: {m['jobs_per_s']:,.1f} jobs/s, gap before a start p50"
            f" {m['gap_p50']:,.0f} ms, max {m['gap_max']:,.0f} ms"
        )
    bound = args.cap * 1000 / args.service_ms
    rate = statistics.median(m["jobs_per_s"] for m in rounds)
    print()
    print(
        f"tenant A: {args.jobs} synthesis jobs of {args.service_ms} ms, capped at {args.cap};"
        f" one worker of concurrency {args.concurrency}, shipped defaults; {args.rounds}"
        f" round(s); Python {platform.python_version()}"
    )
    print()
    print("| A's jobs/s | the cap's bound (cap / service) | ratio | gap p50 (ms) | gap max (ms) |")
    print("|---:|---:|---:|---:|---:|")
    gap50 = statistics.median(m["gap_p50"] for m in rounds)
    gapmax = max(m["gap_max"] for m in rounds)
    print(f"| {rate:,.1f} | {bound:,.0f} | {rate / bound:.2f} | {gap50:,.0f} | {gapmax:,.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--cap", type=int, default=2)
    parser.add_argument("--service-ms", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=1)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
