"""splatq with fair scheduling off (one queue per stream in arrival order): the baseline of
the fair-scheduling cost in `bench.engine_throughput`. Same workload as `splatq_noop`."""

from __future__ import annotations

from bench.peers import splatq_noop

NAME: str = f"{splatq_noop.NAME} (arrival order)"
remaining = splatq_noop.remaining
reset = splatq_noop.reset


async def enqueue(redis_url: str, n_jobs: int) -> None:
    await splatq_noop.enqueue(redis_url, n_jobs, fair=False)


def worker_command(redis_url: str, concurrency: int) -> list[str]:
    return splatq_noop.worker_command(redis_url, concurrency, fair=False)
