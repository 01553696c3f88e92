"""No-op jobs per second through splatq's engine vs SAQ and taskiq, one worker process each,
on one redis-server started by this script.

Usage: python -m bench.engine_throughput [--jobs 20000] [--concurrency 32] [--rounds 3]
Needs the bench extra (`pip install -e '.[bench]'`); `make bench` does that.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import tempfile
from pathlib import Path

from bench.peers import harness
from bench.peers.harness import Measurement
from splatq.shared.redis.server import RedisServer


def _row(name: str, values: list[float], base: float) -> str:
    med = statistics.median(values)
    return (
        f"| {name:<44} | {med:>9,.0f} | {min(values):>7,.0f}-{max(values):<7,.0f} | "
        f"{med / base:>5.2f} |"
    )


async def run(n_jobs: int, concurrency: int, rounds: int, only: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp), appendonly=False)
        await server.start()
        results: dict[str, list[Measurement]] = {}
        try:
            for r in range(rounds):
                # Interleaved rounds: machine noise hits every system alike.
                for peer in harness.PEERS:
                    if only and not peer.NAME.startswith(only):
                        continue
                    m = await harness.check(peer, server.url, n_jobs, concurrency, verbose=False)
                    results.setdefault(m.name, []).append(m)
                    print(f"round {r + 1}: {m.name:<44} {m.steady_per_s:>8,.0f} jobs/s")
        finally:
            await server.stop()
    splatq_name = next(n for n in results if n.startswith("splatq"))
    base = statistics.median(m.steady_per_s for m in results[splatq_name])
    print()
    print(
        f"{n_jobs} no-op jobs, one worker process, concurrency {concurrency}, {rounds} rounds, "
        f"Python {platform.python_version()}, {platform.machine()}"
    )
    print("steady = from the first finished job to the last (worker start-up excluded)\n")
    print(f"| {'system':<44} | {'jobs/s':>9} | {'range':^15} | {'ratio':>5} |")
    print(f"|{'-' * 46}|{'-' * 11}|{'-' * 17}|{'-' * 7}|")
    for name, ms in results.items():
        print(_row(name, [m.steady_per_s for m in ms], base))
    print("\nincluding worker start-up (from process spawn):\n")
    print(f"| {'system':<44} | {'jobs/s':>9} | {'range':^15} | {'ratio':>5} |")
    print(f"|{'-' * 46}|{'-' * 11}|{'-' * 17}|{'-' * 7}|")
    base_spawn = statistics.median(m.from_spawn_per_s for m in results[splatq_name])
    for name, ms in results.items():
        print(_row(name, [m.from_spawn_per_s for m in ms], base_spawn))
    print("\nRedis CPU per job (INFO cpu, enqueue through drain; one Redis primary's CPU is the")
    print("ceiling of a deployment, so lower is better):\n")
    for name, ms in results.items():
        cpu = statistics.median(m.redis_cpu_us_per_job for m in ms)
        print(f"  {name:<44} {cpu:>7,.0f} µs")
    print("\nenqueue rate (64 producers in one process):\n")
    for name, ms in results.items():
        print(f"  {name:<44} {statistics.median(m.enqueue_per_s for m in ms):>9,.0f} jobs/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default="", help="run one system (name prefix), e.g. splatq")
    args = parser.parse_args()
    asyncio.run(run(args.jobs, args.concurrency, args.rounds, args.only))


if __name__ == "__main__":
    main()
