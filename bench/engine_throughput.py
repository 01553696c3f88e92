"""No-op jobs per second through splatq's engine vs SAQ and taskiq, one worker process each,
on one redis-server started by this script.

Usage: python -m bench.engine_throughput [--jobs 10000] [--concurrency 10,50] [--rounds 3]
  [--only splatq,taskiq]
Needs the bench extra (`pip install -e '.[bench]'`); `make bench` does that.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import tempfile
from pathlib import Path

from bench.peers import harness, splatq_noop, splatq_staged_noop
from bench.peers.harness import Measurement
from splatq.shared.redis.server import RedisServer


def _row(name: str, values: list[float], base: float) -> str:
    med = statistics.median(values)
    return (
        f"| {name:<44} | {med:>9,.0f} | {min(values):>7,.0f}-{max(values):<7,.0f} | "
        f"{med / base:>5.2f} |"
    )


async def run(n_jobs: int, concurrencies: list[int], rounds: int, only: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp), appendonly=False)
        await server.start()
        results: dict[int, dict[str, list[Measurement]]] = {}
        try:
            for r in range(rounds):
                # Interleaved rounds: machine noise hits every system alike.
                for concurrency in concurrencies:
                    for peer in harness.PEERS:
                        if only and not any(peer.NAME.startswith(o) for o in only.split(",")):
                            continue
                        m = await harness.check(
                            peer, server.url, n_jobs, concurrency, verbose=False
                        )
                        results.setdefault(concurrency, {}).setdefault(m.name, []).append(m)
                        print(
                            f"round {r + 1} c={concurrency}: {m.name:<44} "
                            f"{m.steady_per_s:>8,.0f} jobs/s  redis {m.redis_cpu_us_per_job:5.0f} "
                            f"µs/job  worker {m.worker_cpu_us_per_job:5.0f} µs/job"
                        )
        finally:
            await server.stop()
    print(
        f"\n{n_jobs} no-op jobs, one worker process, {rounds} rounds, "
        f"Python {platform.python_version()}, {platform.machine()}"
    )
    for concurrency, by_system in results.items():
        _report(concurrency, by_system)


def _median(ms: list[Measurement], attr: str) -> float:
    return statistics.median(getattr(m, attr) for m in ms)


def _report(concurrency: int, results: dict[str, list[Measurement]]) -> None:
    names = list(results)
    base_name = next((n for n in names if n.startswith("taskiq")), names[0])
    print(f"\n### concurrency {concurrency} (ratios against {base_name.split(' ')[0]})\n")
    print("steady = from the first finished job to the last (worker start-up excluded)\n")
    print(f"| {'system':<44} | {'jobs/s':>9} | {'range':^15} | {'ratio':>5} |")
    print(f"|{'-' * 46}|{'-' * 11}|{'-' * 17}|{'-' * 7}|")
    base = _median(results[base_name], "steady_per_s")
    for name, ms in results.items():
        print(_row(name, [m.steady_per_s for m in ms], base))
    print(
        "\nRedis CPU per job from Redis's own accounting (INFO cpu; one primary's CPU is the "
        "ceiling of a deployment), and Redis memory a finished job leaves behind (INFO memory):\n"
        "'bounded' is the part in the capped outbox and the expiring replay memos, 'kept per "
        "job' the rest (the record, its history, its listing entry), held for the retention\n"
    )
    print(
        f"| {'system':<44} | {'enqueue µs':>10} | {'drain µs':>8} | {'total µs':>8} | "
        f"{'ratio':>5} | {'retained B/job':>14} | {'of it bounded':>13} | {'kept per job':>12} |"
    )
    print("|" + "|".join("-" * w for w in (46, 12, 10, 10, 7, 16, 15, 14)) + "|")
    base_cpu = _median(results[base_name], "redis_cpu_us_per_job")
    for name, ms in results.items():
        total = _median(ms, "redis_cpu_us_per_job")
        retained = _median(ms, "retained_bytes_per_job")
        bounded = _median(ms, "bounded_bytes_per_job")
        print(
            f"| {name:<44} | {_median(ms, 'enqueue_cpu_us_per_job'):>10.1f} | "
            f"{_median(ms, 'drain_cpu_us_per_job'):>8.1f} | {total:>8.1f} | "
            f"{total / base_cpu:>5.2f} | {retained:>14,.0f} | {bounded:>13,.0f} | "
            f"{retained - bounded:>12,.0f} |"
        )
    whole, staged = (
        next((n for n in names if n == splatq_noop.NAME), None),
        next((n for n in names if n == splatq_staged_noop.NAME), None),
    )
    if whole and staged:
        # Both enqueue alike; the staged drain adds the hops (and the cleanup stage's run).
        hop = (
            _median(results[staged], "drain_cpu_us_per_job")
            - _median(results[whole], "drain_cpu_us_per_job")
        ) / splatq_staged_noop.HOPS
        print(
            f"\nper stage hop (staged drain less whole-job drain, over "
            f"{splatq_staged_noop.HOPS} hops; the cleanup stage's run included): {hop:.1f} µs"
        )
    print(
        "\nthe worker process's own CPU per job (user + system, its whole session, from the "
        "first finished job to the last) and the throughput that alone allows one process "
        "(1 s / that):\n"
    )
    for name, ms in results.items():
        cpu = _median(ms, "worker_cpu_us_per_job")
        bound = f"{1e6 / cpu:>9,.0f} jobs/s" if cpu else "-"
        print(f"  {name:<44} {cpu:>7.1f} µs/job   bound {bound}")
    print("\nenqueue rate (64 producers in one process):\n")
    for name, ms in results.items():
        print(f"  {name:<44} {_median(ms, 'enqueue_per_s'):>9,.0f} jobs/s")
    for name, ms in results.items():
        last = ms[-1]
        for phase, stats in (("enqueue", last.enqueue_commands), ("drain", last.drain_commands)):
            top = sorted(stats.items(), key=lambda kv: -kv[1][1])[:6]
            cells = ", ".join(f"{k} {calls:.2f}x {us:.1f}µs" for k, (calls, us) in top)
            total = sum(calls for calls, _ in stats.values())  # the scripts' own included
            print(
                f"\n  {name} {phase} (commandstats per job, last round): {total:.2f} commands; "
                f"{cells}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument(
        "--concurrency", default="10,50", help="comma-separated worker concurrencies"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--only", default="", help="systems to run (comma-separated name prefixes), e.g. splatq"
    )
    args = parser.parse_args()
    concurrencies = [int(c) for c in str(args.concurrency).split(",") if c]
    asyncio.run(run(args.jobs, concurrencies, args.rounds, args.only))


if __name__ == "__main__":
    main()
