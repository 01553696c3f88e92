"""Measures one adapter: enqueue n no-op jobs, start one worker process, time the drain.

Also a self-check CLI (`python -m bench.peers.harness --redis-url ...`) against a throwaway
Redis; it deletes only adapter keys.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from bench.processes import stop_process

from . import saq_noop, splatq_fifo_noop, splatq_noop, splatq_staged_noop, taskiq_noop

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


PEERS: tuple[Peer, ...] = (
    splatq_noop, splatq_fifo_noop, splatq_staged_noop, saq_noop, taskiq_noop,
)  # fmt: skip


@dataclass(frozen=True)
class Measurement:
    name: str
    enqueue_per_s: float
    steady_per_s: float  # from the first finished job to the last
    from_spawn_per_s: float  # includes interpreter and library start-up
    redis_cpu_us_per_job: float  # Redis's own CPU (INFO cpu), enqueue through drain, per job
    enqueue_cpu_us_per_job: float = 0.0  # the enqueue phase alone (INFO cpu)
    drain_cpu_us_per_job: float = 0.0  # the drain phase alone (INFO cpu)
    # Redis's used_memory after the drain less before the enqueue, per job: what a finished
    # job leaves behind (records, histories, indexes) until retention removes it.
    retained_bytes_per_job: float = 0.0
    # Of that, the part in structures that stop growing (the outbox, capped; replay memos,
    # expiring): the rest is what each job keeps for its whole retention.
    bounded_bytes_per_job: float = 0.0
    # INFO commandstats per phase: command -> (calls per job, usec per job)
    enqueue_commands: dict[str, tuple[float, float]] = field(default_factory=dict)
    drain_commands: dict[str, tuple[float, float]] = field(default_factory=dict)
    # The worker's own CPU (every process of its session: user + system, /proc) from the first
    # finished job to the last, per job finished in that window: what bounds one worker
    # process's throughput (1 s of CPU / this), start-up excluded.
    worker_cpu_us_per_job: float = 0.0


async def _redis_cpu_s(redis_url: str) -> float:
    """Redis's user + system CPU seconds so far (the bench's Redis is its own)."""
    from redis.asyncio import Redis  # noqa: PLC0415 - keeps the adapters' imports first

    client = Redis.from_url(redis_url)
    try:
        info = await client.info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
    finally:
        await client.aclose()


def _session_cpu_s(sid: int) -> float:
    """User + system CPU seconds of the live processes of session `sid` (Linux /proc), with
    what their waited-for children used: a worker manager's child counts with it."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                raw = f.read()
        except OSError:
            continue  # gone meanwhile
        # the command name may hold spaces: the fields start after its closing parenthesis
        fields = raw[raw.rindex(b")") + 2 :].split()
        if int(fields[3]) != sid:  # field 6, the session id
            continue
        total += sum(int(v) for v in fields[11:15])  # utime stime cutime cstime
    return total / tick


async def _redis_memory(redis_url: str) -> int:
    """Redis's used_memory in bytes."""
    from redis.asyncio import Redis  # noqa: PLC0415 - keeps the adapters' imports first

    client = Redis.from_url(redis_url)
    try:
        return int((await client.info("memory"))["used_memory"])
    finally:
        await client.aclose()


# Memory that does not grow with the jobs kept: splatq's outbox streams (capped at
# SPLATQ_EVENTS_MAXLEN entries per partition) and its replay memos (they expire within a
# minute). Reported apart from what each finished job keeps until its retention ends.
_BOUNDED = re.compile(r"^splatq:\{p\d+\}:(events|replay:.*)$")


async def _bounded_memory(redis_url: str) -> int:
    """Bytes (MEMORY USAGE, every element counted) of the keys `_BOUNDED` names."""
    from redis.asyncio import Redis  # noqa: PLC0415 - keeps the adapters' imports first

    client = Redis.from_url(redis_url, decode_responses=True)
    try:
        total = 0
        async for key in client.scan_iter(match="splatq:*", count=1000):
            if _BOUNDED.match(key):
                total += int(await client.memory_usage(key, samples=0) or 0)
        return total
    finally:
        await client.aclose()


async def _command_stats(redis_url: str, reset: bool) -> dict[str, tuple[int, int]]:
    """INFO commandstats as command -> (calls, usec), then CONFIG RESETSTAT when `reset`."""
    from redis.asyncio import Redis  # noqa: PLC0415 - keeps the adapters' imports first

    client = Redis.from_url(redis_url)
    try:
        info = await client.info("commandstats")
        if reset:
            await client.config_resetstat()
    finally:
        await client.aclose()
    return {
        name.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"]))
        for name, v in info.items()
        if isinstance(v, dict)
    }


def _per_job(stats: dict[str, tuple[int, int]], n: int) -> dict[str, tuple[float, float]]:
    skip = {"info", "config|resetstat", "config", "flushall", "scan", "unlink"}
    return {k: (c / n, u / n) for k, (c, u) in stats.items() if k not in skip}


async def check(
    peer: Peer, redis_url: str, n_jobs: int, concurrency: int, verbose: bool = True
) -> Measurement:
    """One round. Raises AssertionError/TimeoutError on a failed check."""
    await peer.reset(redis_url)
    mem0 = await _redis_memory(redis_url)
    bounded0 = await _bounded_memory(redis_url)
    await _command_stats(redis_url, reset=True)
    cpu0 = await _redis_cpu_s(redis_url)
    t0 = time.perf_counter()
    await peer.enqueue(redis_url, n_jobs)
    enqueue_s = time.perf_counter() - t0
    cpu_enqueued = await _redis_cpu_s(redis_url)
    enqueue_commands = _per_job(await _command_stats(redis_url, reset=True), n_jobs)
    before = await peer.remaining(redis_url)
    assert before == n_jobs, f"{peer.NAME}: remaining={before} after enqueue, want {n_jobs}"

    proc = await asyncio.create_subprocess_exec(
        *peer.worker_command(redis_url, concurrency), cwd=REPO_ROOT, start_new_session=True
    )
    spawned = time.perf_counter()
    first: tuple[float, int] | None = None  # (time, remaining) at the first observed progress
    worker_cpu0 = worker_cpu_end = 0.0
    try:
        while True:
            left = await peer.remaining(redis_url)
            now = time.perf_counter()
            if first is None and left < n_jobs:
                first = (now, left)
                worker_cpu0 = _session_cpu_s(proc.pid)
            if left == 0:
                worker_cpu_end = _session_cpu_s(proc.pid)
                cpu_end = await _redis_cpu_s(redis_url)
                cpu_s = cpu_end - cpu0
                drain_commands = _per_job(await _command_stats(redis_url, reset=False), n_jobs)
                break
            if proc.returncode is not None:
                raise AssertionError(f"{peer.NAME}: worker exited {proc.returncode}, {left} left")
            if now - spawned > DRAIN_TIMEOUT_S:
                raise TimeoutError(f"{peer.NAME}: {left} jobs left after {DRAIN_TIMEOUT_S:.0f} s")
            await asyncio.sleep(POLL_S)
    finally:
        await stop_process(proc, TERM_GRACE_S)
        # What the finished jobs leave behind, after the worker has gone (its own connection
        # and consumer state go with it).
        retained = (await _redis_memory(redis_url) - mem0) / n_jobs
        bounded = (await _bounded_memory(redis_url) - bounded0) / n_jobs
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
    return Measurement(
        peer.NAME,
        n_jobs / enqueue_s,
        steady,
        from_spawn,
        cpu_s * 1e6 / n_jobs,
        enqueue_cpu_us_per_job=(cpu_enqueued - cpu0) * 1e6 / n_jobs,
        drain_cpu_us_per_job=(cpu_end - cpu_enqueued) * 1e6 / n_jobs,
        retained_bytes_per_job=retained,
        bounded_bytes_per_job=bounded,
        enqueue_commands=enqueue_commands,
        drain_commands=drain_commands,
        worker_cpu_us_per_job=(
            (worker_cpu_end - worker_cpu0) * 1e6 / first[1] if first[1] else 0.0
        ),
    )


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
