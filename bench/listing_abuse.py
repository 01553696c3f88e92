"""What one tenant's listings cost another tenant (issue #21, item 9): a real gateway process
on a real redis-server; tenant `abuser` has ABUSED canceled jobs and runs LOOPS concurrent
loops of `GET /v1/jobs?status=completed&limit=1` (a filter that matches nothing, following
no cursor), while tenant `victim` reads its one job (`GET /v1/jobs/{id}`) in a sequential
loop. Prints the victim's median and p99 alone and under the loops, and how the abuser's
requests were answered.

Usage: python -m bench.listing_abuse [--abused 1100] [--loops 32] [--samples 300]
       [--list-rate 10] [--list-burst 20]   (`--list-rate 0`: no listing rate limit)
       [--abuse get]   (the loops read one of the abuser's jobs instead: the floor, what
                        as many clients cost doing the cheapest authenticated read)
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import aiohttp

from bench.gateway_submit import _gateway_env, _service
from splatq.shared.engine.jobs import JobSpec
from splatq.shared.engine.queue import JobQueue
from splatq.shared.redis.client import connect
from splatq.shared.redis.server import RedisServer, free_port
from splatq.shared.settings import Settings

ABUSER_KEY, VICTIM_KEY = "bench-abuser-key", "bench-victim-key"


async def _fill(redis_url: str, abused: int) -> tuple[str, str]:
    """`abused` canceled jobs of the abuser; the victim's one job id and the abuser's last."""
    redis = connect(redis_url)
    queue = JobQueue(redis, Settings(redis_url=redis_url))
    await queue.setup()
    job = None
    for n in range(abused):
        job = await queue.enqueue(JobSpec(tenant="abuser", quality="preview", metadata={"n": n}))
        await queue.cancel(job.job_id, "abuser")
    victim = await queue.enqueue(JobSpec(tenant="victim", quality="preview"))
    await redis.aclose()
    assert job is not None
    return victim.job_id, job.job_id


async def _victim(http: aiohttp.ClientSession, url: str, samples: int) -> list[float]:
    times = []
    for _ in range(samples):
        started = time.perf_counter()
        async with http.get(url, headers={"Authorization": f"Bearer {VICTIM_KEY}"}) as resp:
            await resp.read()
            assert resp.status == 200, resp.status
        times.append((time.perf_counter() - started) * 1000)
    return times


async def _abuse(http: aiohttp.ClientSession, url: str, stop: asyncio.Event, seen: Counter[int]):
    while not stop.is_set():
        async with http.get(url, headers={"Authorization": f"Bearer {ABUSER_KEY}"}) as resp:
            await resp.read()
            seen[resp.status] += 1


def _summary(name: str, times: list[float]) -> str:
    p99 = sorted(times)[int(len(times) * 0.99) - 1]
    return f"{name}: median {statistics.median(times):.2f} ms, p99 {p99:.2f} ms"


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        redis = RedisServer(tmp / "redis", port=free_port(), appendonly=False)
        await redis.start()
        try:
            victim_job, abuser_job = await _fill(redis.url, args.abused)
            port = free_port()
            env = _gateway_env(redis.url, port, tmp)
            env["SPLATQ_API_KEYS"] = f"abuser:{ABUSER_KEY},victim:{VICTIM_KEY}"
            if args.list_rate > 0:
                env["SPLATQ_LIST_RATE_LIMIT_PER_S"] = str(args.list_rate)
                env["SPLATQ_LIST_RATE_LIMIT_BURST"] = str(args.list_burst)
            else:
                env["SPLATQ_LIST_RATE_LIMIT_PER_S"] = "1000000"
                env["SPLATQ_LIST_RATE_LIMIT_BURST"] = "1000000000"
            base = f"http://127.0.0.1:{port}"
            argv = [sys.executable, "-m", "splatq.services.gateway"]
            async with _service("gateway", argv, env, f"{base}/readyz", tmp):
                connector = aiohttp.TCPConnector(limit=args.loops + 4)
                async with aiohttp.ClientSession(connector=connector) as http:
                    job_url = f"{base}/v1/jobs/{victim_job}"
                    await _victim(http, job_url, 50)  # warm up
                    alone = await _victim(http, job_url, args.samples)
                    stop, seen = asyncio.Event(), Counter[int]()
                    list_url = f"{base}/v1/jobs?status=completed&limit=1"
                    if args.abuse == "get":
                        list_url = f"{base}/v1/jobs/{abuser_job}"
                    loops = [
                        asyncio.create_task(_abuse(http, list_url, stop, seen))
                        for _ in range(args.loops)
                    ]
                    await asyncio.sleep(0.5)
                    started = time.perf_counter()
                    loaded = await _victim(http, job_url, args.samples)
                    elapsed = time.perf_counter() - started
                    stop.set()
                    await asyncio.gather(*loops)
            print(_summary("victim alone      ", alone))
            print(_summary(f"victim, {args.loops} loops", loaded))
            rate = sum(seen.values()) / (elapsed + 0.5)
            print(f"abuser answers: {dict(seen)} (~{rate:.0f} requests/s)")
        finally:
            await redis.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--abused", type=int, default=1100)
    parser.add_argument("--loops", type=int, default=32)
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--list-rate", type=float, default=10.0)
    parser.add_argument("--list-burst", type=int, default=20)
    parser.add_argument("--abuse", choices=("list", "get"), default="list")
    asyncio.run(main(parser.parse_args()))
