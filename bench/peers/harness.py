"""Measures one adapter: enqueue n no-op jobs, start one worker process, time the drain.

Also a self-check CLI (`python -m bench.peers.harness --redis-url ...`) against a throwaway
Redis; it deletes only adapter keys.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from . import saq_noop, splatq_fifo_noop, splatq_noop, taskiq_noop

REPO_ROOT = Path(__file__).resolve().parents[2]
POLL_S = 0.01
DRAIN_TIMEOUT_S = 120.0
TERM_GRACE_S = 5.0


class Peer(Protocol):
    """The interface every adapter module implements."""

    NAME: str

    def enqueue(self, redis_url: str, n_jobs: int) -> Awaitable[None]: ...
    def worker_command(self, redis_url: str, concurrency: int) -> list[str]: ...
    def remaining(self, redis_url: str) -> Awaitable[int]: ...
    def reset(self, redis_url: str) -> Awaitable[None]: ...


PEERS: tuple[Peer, ...] = (splatq_noop, splatq_fifo_noop, saq_noop, taskiq_noop)


@dataclass(frozen=True)
class Measurement:
    name: str
    enqueue_per_s: float
    steady_per_s: float  # from the first finished job to the last
    from_spawn_per_s: float  # includes interpreter and library start-up
    redis_cpu_us_per_job: float  # Redis's own CPU (INFO cpu), enqueue through drain, per job


async def _redis_cpu_s(redis_url: str) -> float:
    """Redis's user + system CPU seconds so far (the bench's Redis is its own)."""
    from redis.asyncio import Redis  # noqa: PLC0415 - keeps the adapters' imports first

    client = Redis.from_url(redis_url)
    try:
        info = await client.info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
    finally:
        await client.aclose()


async def _stop(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM the worker, then SIGKILL its whole session if it is alive after TERM_GRACE_S.

    The taskiq worker is a manager process with one child; the manager forwards SIGTERM, but a
    SIGKILLed manager would orphan the child, hence the process-group kill.
    """
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), TERM_GRACE_S)
        except TimeoutError:
            print(f"  worker {proc.pid} ignored SIGTERM for {TERM_GRACE_S:.0f} s; SIGKILL")
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # its own session (start_new_session=True)
    await proc.wait()


async def check(
    peer: Peer, redis_url: str, n_jobs: int, concurrency: int, verbose: bool = True
) -> Measurement:
    """One round. Raises AssertionError/TimeoutError on a failed check."""
    await peer.reset(redis_url)
    cpu0 = await _redis_cpu_s(redis_url)
    t0 = time.perf_counter()
    await peer.enqueue(redis_url, n_jobs)
    enqueue_s = time.perf_counter() - t0
    before = await peer.remaining(redis_url)
    assert before == n_jobs, f"{peer.NAME}: remaining={before} after enqueue, want {n_jobs}"

    proc = await asyncio.create_subprocess_exec(
        *peer.worker_command(redis_url, concurrency), cwd=REPO_ROOT, start_new_session=True
    )
    spawned = time.perf_counter()
    first: tuple[float, int] | None = None  # (time, remaining) at the first observed progress
    try:
        while True:
            left = await peer.remaining(redis_url)
            now = time.perf_counter()
            if first is None and left < n_jobs:
                first = (now, left)
            if left == 0:
                cpu_s = await _redis_cpu_s(redis_url) - cpu0
                break
            if proc.returncode is not None:
                raise AssertionError(f"{peer.NAME}: worker exited {proc.returncode}, {left} left")
            if now - spawned > DRAIN_TIMEOUT_S:
                raise TimeoutError(f"{peer.NAME}: {left} jobs left after {DRAIN_TIMEOUT_S:.0f} s")
            await asyncio.sleep(POLL_S)
    finally:
        await _stop(proc)
        await peer.reset(redis_url)

    assert first is not None
    done = now
    from_spawn = n_jobs / (done - spawned)
    steady = first[1] / (done - first[0]) if done > first[0] else float("inf")
    if verbose:
        print(
            f"{peer.NAME}: enqueue {n_jobs / enqueue_s:,.0f} jobs/s; drained {n_jobs} in "
            f"{done - spawned:.2f} s from spawn ({from_spawn:,.0f} jobs/s incl. worker start-up), "
            f"{steady:,.0f} jobs/s from the first finished job"
        )
    return Measurement(peer.NAME, n_jobs / enqueue_s, steady, from_spawn, cpu_s * 1e6 / n_jobs)


async def main() -> None:
    """Check every adapter `--repeat` times in turn."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--redis-url", required=True, help="a throwaway Redis, e.g. port 6399")
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    for _ in range(args.repeat):
        for peer in PEERS:
            await check(peer, args.redis_url, args.jobs, args.concurrency)


if __name__ == "__main__":
    asyncio.run(main())
