"""Soak: the whole stack (`splatq up`) under a steady mixed load of two tenants for minutes,
reporting every process's resident memory over time and Redis memory per retained job.

Starts `splatq up` as an operator would (its embedded redis-server, the gateway, the GPU and
CPU stage workers, the dispatcher, the redriver, the settler, in a temporary data dir), then
submits jobs over HTTP at a steady `--rate` per second, alternating two tenants: `alpha` sends
previews, `beta` previews and a `--full-share` of full jobs. Every `--sample-every` seconds it
records each process's RSS (VmRSS) and thread count, Redis `used_memory` and the jobs Redis
retains (the tenants' listing indexes). Once `--jobs` were submitted and all have ended, it
waits `--idle` seconds and samples once more (drained).

The verdict: per process, RSS after warm-up (the first sample once `--warmup` jobs ended) and
the most it reached after that; issue #27's target is within 10 % over 2,000 jobs, overloaded
(`--rate` above what the workers finish: a backlog) or not.

Usage: python -m bench.soak [--jobs 2000] [--rate 2] [--full-share 0.05] [--sample-every 15]
       [--warmup 200] [--idle 20] [--max-minutes 0] [--drain-timeout 900]
       [--env SPLATQ_X=value ...]
SIGINT/SIGTERM stops it early and still prints the report.
The machine is shared: run it under `flock /tmp/splatq-bench.lock`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import math
import os
import platform
import re
import signal
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from redis.asyncio import Redis

from bench.up_stack import job_form, splatq_up
from splatq.services.stack import ALL_WORKERS, SERVICES, service_argv
from splatq.shared.engine.keys import KeySchema
from splatq.shared.redis.client import connect
from splatq.shared.redis.server import free_port

REPO_ROOT = Path(__file__).resolve().parent.parent
TENANTS = {"alpha": "sq_soak_alpha_key_0123456789", "beta": "sq_soak_beta_key_0123456789"}
TERMINAL = {"completed", "failed", "canceled"}


def sample_png(seed: int) -> bytes:
    from splatq.services.gpu_worker.samples import sample_image  # noqa: PLC0415

    buf = io.BytesIO()
    sample_image(256, seed=seed).save(buf, format="PNG")
    return buf.getvalue()


def rss_mb(pid: int) -> tuple[float, int]:
    """(VmRSS in MB, threads) of a process; (0, 0) once it is gone."""
    rss, threads = 0.0, 0
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
    return rss, threads


def stack_processes(up_pid: int) -> dict[str, int]:
    """The `splatq up` supervisor and its children by service name (redis: the embedded
    redis-server), read from /proc."""
    procs = {"up": up_pid}
    # The services and whichever worker processes the layout runs (one per pod kind, or one
    # per pod kind and class: SPLATQ_UP_LAYOUT).
    names = (*SERVICES, *ALL_WORKERS)
    wanted = {" ".join(("splatq.services.cli", *service_argv(s))): s for s in names}
    raw = Path(f"/proc/{up_pid}/task/{up_pid}/children").read_text().split()
    for pid in map(int, raw):
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
            line = " ".join(a for a in argv if a)
            if "redis-server" in line:
                procs["redis"] = pid
                continue
            for tail, name in wanted.items():
                if line.endswith(tail):
                    procs[name] = pid
    return procs


@dataclass
class Sample:
    elapsed_s: float
    submitted: int
    ended: int
    backlog: int
    rss: dict[str, float]
    threads: dict[str, int]
    redis_used: int
    retained_jobs: int
    label: str = ""


@dataclass
class Load:
    submitted: list[str] = field(default_factory=list)
    refused: int = 0
    ended: int = 0
    failed: int = 0
    open: set[str] = field(default_factory=set)


async def submit(
    http: aiohttp.ClientSession, base: str, tenant: str, quality: str, image: bytes
) -> str | None:
    form, headers = job_form(quality, image, TENANTS[tenant])
    async with http.post(f"{base}/v1/jobs", data=form, headers=headers) as resp:
        body = await resp.json()
        if resp.status in (200, 202):
            return str(body["id"])
        if resp.status in {429, 503}:
            return None
        raise RuntimeError(f"submit answered {resp.status}: {body}")


async def produce(
    http: aiohttp.ClientSession, base: str, args: argparse.Namespace, load: Load
) -> None:
    """`args.jobs` submissions at `args.rate` per second, alternating the two tenants."""
    images = [sample_png(seed) for seed in range(6)]
    started = time.monotonic()
    full_every = round(1 / args.full_share) if args.full_share > 0 else 0
    for i in range(args.jobs):
        await asyncio.sleep(max(0.0, started + i / args.rate - time.monotonic()))
        tenant = "alpha" if i % 2 == 0 else "beta"
        quality = (
            "full" if tenant == "beta" and full_every and (i // 2) % full_every == 0 else "preview"
        )
        job_id = await submit(http, base, tenant, quality, images[i % len(images)])
        if job_id is None:
            load.refused += 1
            continue
        load.submitted.append(job_id)
        load.open.add(job_id)


async def poll_ended(redis: Redis, keys: KeySchema, load: Load) -> None:
    """Move the jobs that reached a terminal state out of `load.open` (read from Redis)."""
    ids = list(load.open)
    for start in range(0, len(ids), 500):
        chunk = ids[start : start + 500]
        pipe = redis.pipeline(transaction=False)
        for job_id in chunk:
            pipe.hget(keys.job(job_id), "status")
        for job_id, status in zip(chunk, await pipe.execute(), strict=True):
            if status in TERMINAL:
                load.open.discard(job_id)
                load.ended += 1
                load.failed += status != "completed"


async def retained_jobs(redis: Redis, keys: KeySchema) -> int:
    total = 0
    for p in range(keys.partitions):
        for tenant in TENANTS:
            total += int(await redis.zcard(keys.tenant_jobs(p, tenant)))
    return total


# What each kind of key holds, by its name (splatq:{pN}:...): the per-job keys a finished job
# keeps for its retention, and the structures that stop growing (the outbox, capped at
# SPLATQ_EVENTS_MAXLEN per partition; replay memos, expiring within a minute).
_KINDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("job record (hash)", re.compile(r":job:job_[0-9A-Z]+$")),
    ("job history (list)", re.compile(r":job:job_[0-9A-Z]+:h$")),
    ("job delivery log", re.compile(r":job:job_[0-9A-Z]+:deliveries$")),
    ("other per-job keys", re.compile(r":job:job_[0-9A-Z]+:")),
    ("listing index", re.compile(r":jobs:[^:]+$")),
    # the job's billing trail (shared/tenants/quota.py): kept 40 days, past the record
    ("job quota saga (40 days)", re.compile(r"^splatq:\{tenant:[^}]*\}:saga:")),
    ("outbox (capped)", re.compile(r"^splatq:\{p\d+\}:events$")),
    ("replay memos (expiring)", re.compile(r":replay:")),
    ("webhook messages", re.compile(r":wh:")),
)


async def memory_by_kind(redis: Redis) -> dict[str, tuple[int, int]]:
    """kind -> (keys, bytes) over every key (MEMORY USAGE, every element counted)."""
    out: dict[str, tuple[int, int]] = {}
    async for key in redis.scan_iter(match="*", count=1000):
        kind = next((name for name, pattern in _KINDS if pattern.search(key)), "everything else")
        size = int(await redis.memory_usage(key, samples=0) or 0)
        n, total = out.get(kind, (0, 0))
        out[kind] = (n + 1, total + size)
    return out


def print_memory_by_kind(by_kind: dict[str, tuple[int, int]], jobs: int) -> None:
    print(f"\nRedis memory by kind of key, {jobs} retained jobs (MEMORY USAGE):\n")
    print("| kind | keys | KB | bytes per retained job |\n|---|---|---|---|")
    for kind, (n, size) in sorted(by_kind.items(), key=lambda kv: -kv[1][1]):
        print(f"| {kind} | {n} | {size / 1024:,.0f} | {size / max(jobs, 1):,.0f} |")
    kept = (
        sum(
            size
            for kind, (_, size) in by_kind.items()
            if kind.startswith(("job ", "other per-job"))
        )
        + by_kind.get("listing index", (0, 0))[1]
    )
    print(f"\nkept per job for its retention (record, history, delivery log, listing, saga): "
          f"{kept / max(jobs, 1):,.0f} bytes")  # fmt: skip


async def take_sample(
    redis: Redis, keys: KeySchema, procs: dict[str, int], load: Load, t0: float, label: str = ""
) -> Sample:
    rss, threads = {}, {}
    for name, pid in procs.items():
        rss[name], threads[name] = rss_mb(pid)
    info = await redis.info("memory")
    return Sample(
        elapsed_s=time.monotonic() - t0,
        submitted=len(load.submitted),
        ended=load.ended,
        backlog=len(load.open),
        rss=rss,
        threads=threads,
        redis_used=int(info["used_memory"]),
        retained_jobs=await retained_jobs(redis, keys),
        label=label,
    )


def print_report(
    samples: Sequence[Sample], names: Sequence[str], args: argparse.Namespace, load: Load,
    redis_base: int,
) -> None:  # fmt: skip
    print()
    print(
        f"machine: {os.cpu_count()} cpus (shared), {platform.machine()}, python "
        f"{platform.python_version()}; {len(load.submitted)} jobs submitted at {args.rate}/s "
        f"(of {args.jobs}), two tenants, "
        f"full share {args.full_share}; refused {load.refused}, failed {load.failed}; "
        f"extra env {args.env or '-'}"
    )
    print()
    head = " | ".join(f"{n} MB" for n in names)
    print(f"| t (s) | submitted | ended | backlog | {head} | redis used MB | retained jobs | "
          "redis KB/job |")  # fmt: skip
    print("|" + "---|" * (len(names) + 7))
    step = max(1, len(samples) // args.rows)
    shown = [s for i, s in enumerate(samples) if i % step == 0 or s.label]
    if samples[-1] not in shown:
        shown.append(samples[-1])
    for s in shown:
        cells = " | ".join(f"{s.rss.get(n, 0):.0f}" for n in names)
        per_job = (s.redis_used - redis_base) / 1024 / s.retained_jobs if s.retained_jobs else 0
        t = f"{s.elapsed_s:.0f}" + (f" ({s.label})" if s.label else "")
        print(f"| {t} | {s.submitted} | {s.ended} | {s.backlog} | {cells} | "
              f"{s.redis_used / 2**20:.1f} | {s.retained_jobs} | {per_job:.1f} |")  # fmt: skip
    warm = next((s for s in samples if s.ended >= args.warmup), None)
    if warm is None:
        print(f"\nno sample after warm-up ({args.warmup} jobs ended)")
        return
    after = [s for s in samples if s.elapsed_s >= warm.elapsed_s]
    print()
    print(f"after warm-up ({warm.ended} jobs ended, t={warm.elapsed_s:.0f} s) to the end "
          f"({samples[-1].ended} jobs):")  # fmt: skip
    print()
    # Under load a sample holds the work in flight (a full job's export and render are tens
    # of MB each, up to the stages' slots), so one sample against another says little about
    # growth. Growth is a slope: the median of the first third of the samples after warm-up
    # against the last third's (the in-load level), and the process drained at the end
    # against the process at warm-up (what jobs left behind).
    loaded = [s for s in after if not s.label]
    third = max(1, len(loaded) // 3)
    first, last = loaded[:third], loaded[-third:]
    print("| process | RSS at warm-up MB | max after MB | median, first third | median, last "
          "third | slope | drained MB | drained vs warm-up | threads |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    worst = 0.0
    for n in names:
        base = warm.rss.get(n, 0)
        top = max(s.rss.get(n, 0) for s in after)
        early = statistics.median(s.rss.get(n, 0) for s in first)
        late = statistics.median(s.rss.get(n, 0) for s in last)
        slope = (late - early) / early * 100 if early else 0
        end = samples[-1].rss.get(n, 0)
        left = (end - base) / base * 100 if base else 0
        if n != "redis":  # Redis holds the retained jobs: reported per job, not as growth
            worst = max(worst, slope, left)
        threads = f"{warm.threads.get(n, 0)} -> {samples[-1].threads.get(n, 0)}"
        print(f"| {n} | {base:.0f} | {top:.0f} | {early:.0f} | {late:.0f} | {slope:+.1f} % | "
              f"{end:.0f} | {left:+.1f} % | {threads} |")  # fmt: skip
    print(
        f"\nworst growth after warm-up (slope, or drained vs warm-up; Redis apart): "
        f"{worst:+.1f} % (target: within 10 %)"
    )


async def measure(
    args: argparse.Namespace,
    base: str,
    redis: Redis,
    procs: dict[str, int],
    samples: list[Sample],
    load: Load,
    stop: asyncio.Event,
) -> None:
    """Submit, sample, wait for the jobs to end (at most `--drain-timeout` once submitting
    stopped), then sample idle. `stop` (SIGINT/SIGTERM) ends it early; the report follows."""
    keys = KeySchema()
    t0 = time.monotonic()
    samples.append(await take_sample(redis, keys, procs, load, t0, "start"))
    deadline = t0 + args.max_minutes * 60 if args.max_minutes else math.inf
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:
        producer = asyncio.create_task(produce(http, base, args, load))
        next_sample = t0 + args.sample_every
        drain_until = math.inf
        while not stop.is_set() and not (producer.done() and not load.open):
            await asyncio.sleep(1.0)
            now = time.monotonic()
            if now >= deadline and not producer.done():
                producer.cancel()  # time is up: no more submissions, let the backlog end
            if producer.done() and drain_until == math.inf:
                drain_until = now + args.drain_timeout
                if not producer.cancelled() and producer.exception() is not None:
                    raise producer.exception()  # type: ignore[misc]
            if now >= drain_until:
                print(f"drain timeout: {len(load.open)} jobs not ended", flush=True)
                break
            await poll_ended(redis, keys, load)
            if now >= next_sample:
                next_sample += args.sample_every
                samples.append(await take_sample(redis, keys, procs, load, t0))
                s = samples[-1]
                workers = " ".join(
                    f"{n}={mb:.0f}MB" for n, mb in s.rss.items() if n.startswith("worker-")
                )
                print(
                    f"t={s.elapsed_s:.0f}s submitted={s.submitted} ended={s.ended} "
                    f"backlog={s.backlog} {workers}",
                    flush=True,
                )
        producer.cancel()
        samples.append(await take_sample(redis, keys, procs, load, t0, "all ended"))
        if not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), args.idle)
            samples.append(await take_sample(redis, keys, procs, load, t0, "drained"))


async def run(args: argparse.Namespace) -> None:
    extra = dict(kv.split("=", 1) for kv in args.env)
    samples: list[Sample] = []
    load = Load()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    with tempfile.TemporaryDirectory(prefix="splatq-soak-") as tmp_name:
        env = {
            "SPLATQ_METRICS_PORT": str(free_port()),
            "SPLATQ_API_KEYS": ",".join(f"{t}:{k}" for t, k in TENANTS.items()),
            "SPLATQ_LOG_LEVEL": "warning",
            "SPLATQ_LOG_FORMAT": "json",
            **extra,
        }
        async with splatq_up(Path(tmp_name), env) as stack:
            base, redis_url, up_pid = stack.base, stack.redis_url, stack.proc.pid
            procs = stack_processes(up_pid)
            names = [n for n in ("up", "redis", *SERVICES, *ALL_WORKERS) if n in procs]
            redis = connect(redis_url)
            redis_base = int((await redis.info("memory"))["used_memory"])
            by_kind: dict[str, tuple[int, int]] = {}
            try:
                await measure(args, base, redis, procs, samples, load, stop)
                by_kind = await memory_by_kind(redis)
            finally:
                await redis.aclose()
                if samples:
                    print_report(samples, names, args, load, redis_base)
                if by_kind:
                    print_memory_by_kind(by_kind, samples[-1].retained_jobs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=2000, help="submissions in all")
    p.add_argument("--rate", type=float, default=2.0, help="submissions per second")
    p.add_argument("--full-share", type=float, default=0.05, help="of beta's jobs, full ones")
    p.add_argument("--sample-every", type=float, default=15.0, help="seconds between samples")
    p.add_argument("--warmup", type=int, default=200, help="jobs ended before the baseline")
    p.add_argument("--idle", type=float, default=20.0, help="seconds idle before 'drained'")
    p.add_argument("--rows", type=int, default=30, help="rows of the time table (about)")
    p.add_argument("--max-minutes", type=float, default=0, help="stop submitting after (0: no)")
    p.add_argument("--drain-timeout", type=float, default=900, help="seconds to wait for the end")
    p.add_argument("--env", action="append", default=[], help="SPLATQ_X=value for the stack")
    asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    main()
