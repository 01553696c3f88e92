"""A fleet of remote-backend workers against a strict fake vendor (issue #26): does the fleet
keep the vendor's limits, and how much of them does it use?

Usage: python -m bench.remote_vendor [--jobs 90] [--workers 4] [--slots 10] [--rate 60]
       [--per-s 60] [--concurrency 5] [--durations 1,2,3,4] [--limiters fleet,per-process]

Per limiter, in the same run: one redis-server, the fake vendor of tests/vendor/fake_vendor.py
on loopback (at most `rate` creations in any sliding `per_s` window and `concurrency`
predictions in flight; a create past either is a *violation*, answered 429 + Retry-After), and
`workers` real `splatq worker` processes with `slots` slots each, SPLATQ_MODEL=remote. All jobs
are submitted at once. `fleet` is the shipped lane (shared/vendor/: GCRA and leased slots in
Redis for every process); `per-process` gives each process its own limiter with the same
numbers -- aiolimiter's algorithm (a leaky bucket of `rate` per `per_s`) and a semaphore of
`concurrency`, what users write by hand. Printed per limiter: violations, the vendor's 429s,
achieved creation rate / limit (between the first and the last accepted creation), the most
predictions in flight, queue wait (job created -> prediction created) p50/p99, and the jobs'
attempts and deferrals.
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
from collections import Counter
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

from splatq.services.gpu_worker.handler import GpuJobHandler
from splatq.services.gpu_worker.metrics import GpuMetrics
from splatq.services.gpu_worker.remote.backend import RemoteModel
from splatq.shared.engine.job_context import JobHandler
from splatq.shared.engine.queue import JobQueue
from splatq.shared.redis.client import connect
from splatq.shared.redis.server import RedisServer
from splatq.shared.settings import Settings
from splatq.shared.storage.store import LocalFileStorage, open_storage
from splatq.shared.vendor.config import VendorConfig, load_vendor_config
from splatq.shared.vendor.credentials import Credential
from splatq.shared.vendor.limiter import BreakerState, LaneState, NotYet, Permit, VendorLane
from splatq.shared.vendor.notes import note_name
from tests.gpu_worker.conftest import opaque_noise_png, stored_spec
from tests.vendor.conftest import TOKEN_ENV, write_config
from tests.vendor.fake_vendor import TOKEN, FakeVendor

REPO = Path(__file__).resolve().parent.parent


class PerProcessLane(VendorLane):
    """One process's own limiter with the vendor's numbers (what users write by hand):
    aiolimiter's leaky bucket (capacity `rate`, draining `rate` per `per_s`) and a counter of
    `concurrency` held slots. Same interface as the fleet's lane; nothing is shared."""

    def __init__(self, redis: Redis, config: VendorConfig) -> None:
        super().__init__(redis, config)
        self._level = 0.0
        self._last = time.monotonic()
        self._held: set[str] = set()
        self._paused_until = 0.0

    def _leak(self) -> None:
        now = time.monotonic()
        rate = self.config.limits.rate / self.config.limits.per_s
        self._level = max(0.0, self._level - (now - self._last) * rate)
        self._last = now

    async def acquire(self, member: str, tenant: str, permit: str, ticket: int) -> Permit | NotYet:
        now_ms = time.time() * 1000
        if now_ms < self._paused_until:
            return NotYet(0, "paused", int(self._paused_until))
        if len(self._held) >= self.config.limits.concurrency:
            return NotYet(50, "slots")
        self._leak()
        if self._level + 1 > self.config.limits.rate:
            rate = self.config.limits.rate / self.config.limits.per_s
            return NotYet(
                max(1, int((self._level + 1 - self.config.limits.rate) / rate * 1000)), "rate"
            )
        self._level += 1
        self._held.add(member)
        return Permit("new")

    async def hold(self, member: str, tenant: str, *, adopt: bool = False) -> bool:
        if adopt:
            self._held.add(member)
        return member in self._held

    async def release(self, member: str, tenant: str) -> bool:
        had = member in self._held
        self._held.discard(member)
        return had

    async def report(
        self, outcome: str, member: str, report_id: str, pause_until_ms: int = 0
    ) -> BreakerState:
        if outcome == "slow_down":  # this process pauses; the others know nothing of it
            self._paused_until = max(self._paused_until, pause_until_ms)
        return BreakerState("closed", 0, 0, False)

    async def state(self) -> LaneState:
        return LaneState(len(self._held), 0, int(self._paused_until), "closed", 0)


def per_process(settings: Settings) -> JobHandler:
    """`splatq worker --handler bench.remote_vendor:per_process`: the remote backend with
    PerProcessLane instead of the fleet's lane."""
    storage = open_storage(settings.storage_url, settings.storage_root)
    config = load_vendor_config(settings.remote_config)
    model = RemoteModel(
        settings, config, Credential(config.auth), storage, lane_factory=PerProcessLane
    )
    return GpuJobHandler(settings, model, storage, GpuMetrics.create())


def _worker_env(redis_url: str, config: Path, storage: Path, slots: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPLATQ_")}
    env.update({
        "SPLATQ_REDIS_URL": redis_url, "SPLATQ_MODEL": "remote",
        "SPLATQ_REMOTE_CONFIG": str(config), "SPLATQ_STORAGE_URL": f"file://{storage}",
        "SPLATQ_DEVICE": "cpu", "SPLATQ_WORKER_CONCURRENCY": str(slots),
        "SPLATQ_INTERACTIVE_SHARE": "1.0", "SPLATQ_LOG_LEVEL": "warning",
        "SPLATQ_LOG_FORMAT": "json", "SPLATQ_MAX_ATTEMPTS": "20", TOKEN_ENV: TOKEN,
    })  # fmt: skip
    return env


async def _run(args: argparse.Namespace, limiter: str) -> dict[str, Any]:
    durations = tuple(float(d) for d in args.durations.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        server = RedisServer(root / "redis", appendonly=False)
        await server.start()
        vendor = FakeVendor(rate=args.rate, per_s=args.per_s, concurrency=args.concurrency,
                            durations=durations)  # fmt: skip
        await vendor.start()
        config = write_config(
            root / "vendor.toml",
            vendor.url,
            limits={
                "rate": args.rate,
                "per_s": args.per_s,
                "concurrency": args.concurrency,
                "slot_ttl_s": 60,
            },
            poll={"initial_s": 0.2, "max_s": 1.0, "factor": 1.5},
            # the shipped breaker and waits (the tests' are short)
            breaker={"failures": 5, "open_s": 30, "open_cap_s": 600, "max_wait_s": 900},
            wait={"inline_max_s": 5},
        )
        storage = LocalFileStorage(root / "objects")
        handler = ["--handler", "bench.remote_vendor:per_process"] if limiter != "fleet" else []
        env = _worker_env(server.url, config, storage.root, args.slots)
        procs = [
            await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "splatq.services.cli",
                "worker",
                *handler,
                cwd=REPO,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for _ in range(args.workers)
        ]
        client = connect(server.url)
        try:
            queue = JobQueue(client, Settings(redis_url=server.url))
            await queue.setup()
            spec = await stored_spec(storage, opaque_noise_png(64))
            await _fleet_up(client, queue, args.workers)
            started = time.monotonic()
            ids = [(await queue.enqueue(spec)).job_id for _ in range(args.jobs)]
            jobs = await _wait_all(queue, ids, args.timeout_s)
            wall = time.monotonic() - started
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                try:
                    await asyncio.wait_for(p.wait(), 20)
                except TimeoutError:
                    p.kill()
            await client.aclose()
            await vendor.close()
            await server.stop()
    return _summary(limiter, args, vendor, jobs, wall)


async def _fleet_up(client: Redis, queue: JobQueue, workers: int) -> None:
    """Until every worker process ticks the fleet clock (started, its model ready): the queue
    wait measured is the limiter's, not the processes' start-up."""
    while True:
        if await client.zcard(queue.keys.workers(0)) >= workers:
            break
        await asyncio.sleep(0.2)
    await asyncio.sleep(1.0)


async def _wait_all(queue: JobQueue, ids: list[str], timeout_s: float) -> list[Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        jobs = [await queue.get(i) for i in ids]
        if all(j is not None and j.status.value in {"completed", "failed"} for j in jobs):
            return jobs
        if time.monotonic() > deadline:
            return jobs
        await asyncio.sleep(0.5)


def _summary(
    limiter: str, args: argparse.Namespace, vendor: FakeVendor, jobs: list[Any], wall: float
) -> dict[str, Any]:
    times = sorted(vendor.create_times)
    achieved = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else 0.0
    waits = sorted(
        int(j.notes[note_name("preview", "submitted")]) - j.created_at_ms
        for j in jobs
        if j is not None and j.notes.get(note_name("preview", "submitted"))
    )

    def pct(q: float) -> float:
        return waits[min(len(waits) - 1, int(q * len(waits)))] / 1000 if waits else float("nan")

    done = [j for j in jobs if j is not None and j.status.value == "completed"]
    errors = Counter(j.error.code for j in jobs if j is not None and j.error is not None)
    return {
        "errors": dict(errors),
        "limiter": limiter,
        "completed": f"{len(done)}/{args.jobs}",
        "violations": len(vendor.violations),
        "429s": vendor.answers[429],
        "rate/limit": achieved / (args.rate / args.per_s),
        "max_in_flight": vendor.max_in_flight,
        "wait_p50_s": pct(0.5),
        "wait_p99_s": pct(0.99),
        "attempts>1": sum(1 for j in done if j.attempts > 1),
        "deferrals": sum(j.deferrals for j in done),
        "wall_s": wall,
        "mean_wait_s": statistics.mean(waits) / 1000 if waits else float("nan"),
    }


def _print(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(f"# remote vendor: {args.workers} workers x {args.slots} slots, {args.jobs} jobs, "
          f"vendor {args.rate}/{args.per_s:g}s and {args.concurrency} in flight, predictions "
          f"{args.durations} s; {platform.node()}, load {os.getloadavg()[0]:.1f}")  # fmt: skip
    cols = ["limiter", "completed", "errors", "violations", "429s", "rate/limit", "max_in_flight",
            "wait_p50_s", "wait_p99_s", "attempts>1", "deferrals", "wall_s"]  # fmt: skip
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        cells = [f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c]) for c in cols]
        print("| " + " | ".join(cells) + " |")


async def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--jobs", type=int, default=90)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--slots", type=int, default=10)
    parser.add_argument("--rate", type=int, default=60)
    parser.add_argument("--per-s", type=float, default=60.0)
    parser.add_argument("--concurrency", type=int, default=5)
    parser.add_argument("--durations", default="1,2,3,4")
    parser.add_argument("--limiters", default="fleet,per-process")
    parser.add_argument("--timeout-s", type=float, default=600.0)
    args = parser.parse_args()
    rows = [await _run(args, limiter) for limiter in args.limiters.split(",")]
    _print(rows, args)


if __name__ == "__main__":
    asyncio.run(main())
