"""No-op jobs per second through splatq's engine on a Redis Cluster of 1, 2 and 3 primaries
(one `splatq worker` process per primary, consuming the partitions on it), Redis CPU per job
on every node, and the cost of SPLATQ_REDIS_WAIT_REPLICAS=1 (3 primaries + 3 replicas).

Usage: python -m bench.cluster [--jobs 6000] [--concurrency 32] [--partitions 6]
Starts its own clusters (redis-server and redis-cli on PATH); prints tables.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from redis.asyncio import Redis
from redis.crc import key_slot

from splatq.shared.engine.jobs import JobSpec
from splatq.shared.engine.keys import STREAMS, KeySchema
from splatq.shared.engine.queue import JobQueue
from splatq.shared.redis.client import connect
from splatq.shared.redis.cluster_server import LocalCluster
from splatq.shared.redis.replica_wait import ReplicaWait
from splatq.shared.settings import Settings

REPO_ROOT = Path(__file__).resolve().parent.parent
PRODUCERS = 64


@dataclass
class Run:
    label: str
    primaries: int
    jobs: int
    steady_per_s: float
    cpu_ms_per_job: list[float]  # per primary: its Redis CPU / the jobs of its partitions
    jobs_per_node: list[int]


async def _cpu_s(port: int) -> float:
    client = Redis(host="127.0.0.1", port=port, decode_responses=True)
    try:
        info = await client.info("cpu")
        return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
    finally:
        await client.aclose()


async def _place_partitions(cluster: LocalCluster, keys: KeySchema) -> dict[int, list[int]]:
    """Partition p's slot on primary p % n, so each primary serves an equal share (what an
    operator does with `redis-cli --cluster reshard`; docs/cluster.md). Returns port ->
    partitions."""
    primaries = sorted(v.port for v in await cluster.topology() if v.role == "master")
    placed: dict[int, list[int]] = {port: [] for port in primaries}
    for p in range(keys.partitions):
        port = primaries[p % len(primaries)]
        await cluster.migrate_slots([key_slot(keys.tag(p).encode())], port)
        placed[port].append(p)
    return placed


async def _enqueue(queue: JobQueue, n_jobs: int) -> None:
    left = n_jobs
    spec = JobSpec(tenant="bench", quality="preview")

    async def producer() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await queue.enqueue(spec)

    await asyncio.gather(*(producer() for _ in range(min(PRODUCERS, n_jobs))))


async def _backlog(redis: Redis, keys: KeySchema, partitions: list[int]) -> int:
    total = 0
    for p in partitions:
        for stream in STREAMS:
            total += int(await redis.xlen(keys.stream(p, stream)))
    return total


def _worker(url: str, partitions: list[int], n_partitions: int, concurrency: int,
            wait_replicas: int) -> list[str]:  # fmt: skip
    return [
        "env", f"SPLATQ_REDIS_URL={url}", f"SPLATQ_PARTITIONS={n_partitions}",
        f"SPLATQ_WORKER_PARTITIONS={','.join(map(str, partitions))}",
        f"SPLATQ_WORKER_CONCURRENCY={concurrency}", f"SPLATQ_REDIS_WAIT_REPLICAS={wait_replicas}",
        "SPLATQ_LOG_LEVEL=warning", "SPLATQ_LOG_FORMAT=json",
        sys.executable, "-m", "splatq.services.cli", "worker",
        "--handler", "bench.peers.splatq_noop:make",
    ]  # fmt: skip


async def one_run(
    tmp: Path, label: str, primaries: int, replicas: int, n_jobs: int, concurrency: int,
    n_partitions: int, wait_replicas: int = 0,
) -> Run:  # fmt: skip
    cluster = LocalCluster(tmp / label.replace(" ", "-"), primaries=primaries, replicas=replicas)
    await cluster.start()
    keys = KeySchema(partitions=n_partitions)
    redis = connect(cluster.url)
    procs: list[asyncio.subprocess.Process] = []
    try:
        placed = await _place_partitions(cluster, keys)
        queue = JobQueue(redis, Settings(redis_url=cluster.url, partitions=n_partitions))
        await queue.setup()
        await _enqueue(queue, n_jobs)
        per_node = {port: await _backlog(redis, keys, ps) for port, ps in placed.items()}
        cpu0 = {port: await _cpu_s(port) for port in placed}
        all_partitions = list(range(n_partitions))
        for ps in placed.values():
            cmd = _worker(cluster.url, ps, n_partitions, concurrency, wait_replicas)
            procs.append(await asyncio.create_subprocess_exec(*cmd, cwd=REPO_ROOT,
                                                              start_new_session=True))  # fmt: skip
        first: tuple[float, int] | None = None
        while True:
            left = await _backlog(redis, keys, all_partitions)
            now = time.perf_counter()
            if first is None and left < n_jobs:
                first = (now, left)
            if left == 0:
                break
            for proc in procs:
                if proc.returncode is not None:
                    raise RuntimeError(f"a worker exited with {proc.returncode}, {left} left")
            await asyncio.sleep(0.02)
        assert first is not None
        steady = first[1] / max(now - first[0], 1e-6)
        cpu = [(await _cpu_s(port) - cpu0[port]) * 1000 / max(per_node[port], 1) for port in placed]
        return Run(label, primaries, n_jobs, steady, cpu, list(per_node.values()))
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                await asyncio.wait_for(proc.wait(), 15)
            except TimeoutError:
                os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
        await redis.aclose()
        await cluster.stop()


async def accept_latency(tmp: Path, n: int) -> dict[str, float]:
    """Median enqueue (a gateway's accept) latency, without and with WAIT 1 (3 + 3 nodes)."""
    cluster = LocalCluster(tmp / "accept", primaries=3, replicas=1)
    await cluster.start()
    redis = connect(cluster.url)
    try:
        queue = JobQueue(redis, Settings(redis_url=cluster.url, partitions=6))
        await queue.setup()
        wait = ReplicaWait(redis, 1, 500)
        out: dict[str, float] = {}
        for label, waiting in (("enqueue", False), ("enqueue + WAIT 1", True)):
            times = []
            for _ in range(n):
                t0 = time.perf_counter()
                result = await queue.enqueue(JobSpec(tenant="bench", quality="preview"))
                if waiting:
                    await wait.after_write(queue.keys.job(result.job_id))
                times.append((time.perf_counter() - t0) * 1000)
            out[label] = statistics.median(times)
        await wait.aclose()
        return out
    finally:
        await redis.aclose()
        await cluster.stop()


async def run(n_jobs: int, concurrency: int, n_partitions: int) -> None:
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        runs = []
        for primaries in (1, 2, 3):
            r = await one_run(tmp, f"{primaries} primaries", primaries, 0, n_jobs, concurrency,
                              n_partitions)  # fmt: skip
            print(f"{r.label}: {r.steady_per_s:,.0f} jobs/s", flush=True)
            runs.append(r)
        waits = []
        for wait_replicas in (0, 1):
            r = await one_run(tmp, f"3+3 WAIT {wait_replicas}", 3, 1, n_jobs, concurrency,
                              n_partitions, wait_replicas)  # fmt: skip
            print(f"{r.label}: {r.steady_per_s:,.0f} jobs/s", flush=True)
            waits.append(r)
        accept = await accept_latency(tmp, 500)
    base = runs[0].steady_per_s
    print(
        f"\n{n_jobs} no-op jobs per run, {n_partitions} partitions placed evenly over the "
        f"primaries, one worker process (concurrency {concurrency}) per primary; Python "
        f"{platform.python_version()}, {os.cpu_count()} CPUs\n"
    )
    print(
        "| primaries | jobs/s | vs 1 primary | Redis CPU per job, each primary (ms) "
        "| jobs per primary |"
    )
    print("|---|---|---|---|---|")
    for r in runs:
        cpu = " / ".join(f"{c:.3f}" for c in r.cpu_ms_per_job)
        print(f"| {r.primaries} | {r.steady_per_s:,.0f} | {r.steady_per_s / base:.2f} | {cpu} | "
              f"{' / '.join(map(str, r.jobs_per_node))} |")  # fmt: skip
    print(
        "\nSPLATQ_REDIS_WAIT_REPLICAS on 3 primaries + 3 replicas (WAIT after every commit "
        "batch):\n"
    )
    print("| setting | jobs/s | Redis CPU per job, each primary (ms) |")
    print("|---|---|---|")
    for r in waits:
        cpu = " / ".join(f"{c:.3f}" for c in r.cpu_ms_per_job)
        print(f"| {r.label} | {r.steady_per_s:,.0f} | {cpu} |")
    print("\nAccept latency (one enqueue at a time, median of 500):\n")
    print("| call | ms |")
    print("|---|---|")
    for label, ms in accept.items():
        print(f"| {label} | {ms:.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=6000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--partitions", type=int, default=6)
    args = parser.parse_args()
    asyncio.run(run(args.jobs, args.concurrency, args.partitions))


if __name__ == "__main__":
    main()
