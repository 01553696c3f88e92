"""Preview latency under a flood of full jobs, whole-job workers against the staged pipeline.

Through the whole stack: a redis-server, the gateway (`splatq gateway`) and, per mode, the
workers; jobs are submitted over HTTP with `Prefer: wait=120`, so a submission's time is the
preview's end-to-end time (upload, validation, queueing, every stage, the commit).

Modes (each measured in the same run, on the same machine):
  whole        one `splatq worker` process runs whole jobs
  staged       `splatq worker --stages reconstruct` (the GPU pod's role) and
               `splatq worker --stages ingest,export,render,publish,cleanup` (the CPU pod),
               each its own process
  whole-even, staged-even   the same without CPU priority (SPLATQ_SYNTHESIS_NICE=0, torch's
               own thread count): every job's CPU work shares the cores evenly, as before
  up           the whole flood at once: the stack exactly as `splatq up` starts it (its
               defaults: per-class workers), `--floods` full jobs submitted at once, then
               previews one after another while the flood lasts (bench/stack_flood.py)
  up-shared    the same with `SPLATQ_UP_LAYOUT=shared` (one worker process per pod kind
               serving both classes: `splatq up` before per-class workers)

For each other mode: the preview end-to-end time unloaded (previews one after another), then
under a flood of full jobs (`--flood` submitted at once, more topped up as they finish) with a
preview every `--every` seconds; the table reports both and their ratio.

Usage: python -m bench.pipeline [--modes whole,staged] [--flood 6] [--previews 8] [--every 3]
       python -m bench.pipeline --modes up-shared,up [--floods 16,48] [--previews 20]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from bench.stack_flood import FloodResult, p95, run_floods, stage_spans
from bench.up_stack import job_form
from splatq.shared.redis.client import connect
from splatq.shared.redis.server import RedisServer, free_port

REPO_ROOT = Path(__file__).resolve().parent.parent
TENANT, API_KEY = "bench", "sq_bench_pipeline_key"
CPU_STAGES = "ingest,export,render,publish,cleanup"


def _env(redis_url: str, tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPLATQ_")}
    env.update(
        SPLATQ_REDIS_URL=redis_url,
        SPLATQ_API_KEYS=f"{TENANT}:{API_KEY}",
        SPLATQ_STORAGE_URL=(tmp / "storage").resolve().as_uri(),
        SPLATQ_DATA_DIR=str(tmp / "data"),
        SPLATQ_LOG_LEVEL="warning",
        SPLATQ_LOG_FORMAT="json",
        SPLATQ_RATE_LIMIT_PER_S="1000",
        SPLATQ_RATE_LIMIT_BURST="1000",
        SPLATQ_DEVICE="cpu",
        SPLATQ_FETCH_BLOCK_MS="200",
        **extra,
    )
    return env


def _spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "splatq.services.cli", *args],
        cwd=REPO_ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def sample_png(seed: int) -> bytes:
    from splatq.services.gpu_worker.samples import sample_image  # noqa: PLC0415

    buf = io.BytesIO()
    sample_image(256, seed=seed).save(buf, format="PNG")
    return buf.getvalue()


@dataclass
class Client:
    http: aiohttp.ClientSession
    base: str

    async def submit(self, quality: str, image: bytes, wait_s: int = 0) -> tuple[float, dict]:
        form, headers = job_form(quality, image, API_KEY, wait_s)
        started = time.monotonic()
        async with self.http.post(f"{self.base}/v1/jobs", data=form, headers=headers) as resp:
            body = await resp.json()
            if resp.status not in (200, 202):
                raise RuntimeError(f"submit answered {resp.status}: {body}")
        return time.monotonic() - started, body

    async def status(self, job_id: str) -> str:
        headers = {"Authorization": f"Bearer {API_KEY}"}
        async with self.http.get(f"{self.base}/v1/jobs/{job_id}", headers=headers) as resp:
            return str((await resp.json())["status"])


@contextlib.asynccontextmanager
async def gateway(redis_url: str, tmp: Path) -> AsyncIterator[Client]:
    port = free_port()
    proc = _spawn(
        ["gateway"],
        _env(redis_url, tmp, SPLATQ_GATEWAY_PORT=str(port), SPLATQ_GATEWAY_HOST="127.0.0.1"),
        tmp / "gateway.log",
    )
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
            for _ in range(300):
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.get(f"{base}/readyz") as resp:
                        if resp.status == 200:
                            break
                await asyncio.sleep(0.1)
            else:
                raise RuntimeError("gateway not ready")
            yield Client(http, base)
    finally:
        _stop([proc])


EVEN = {"SPLATQ_SYNTHESIS_NICE": "0", "SPLATQ_SYNTHESIS_TORCH_THREADS": "0"}


def start_workers(mode: str, redis_url: str, tmp: Path, extra: dict[str, str]) -> list:
    if mode.endswith("-even"):
        mode, extra = mode.removesuffix("-even"), {**EVEN, **extra}
    if mode == "whole":
        env = _env(redis_url, tmp, SPLATQ_WORKER_CONCURRENCY="4", **extra)
        return [_spawn(["worker"], env, tmp / "worker-whole.log")]
    gpu = _env(redis_url, tmp, SPLATQ_STAGES="reconstruct", SPLATQ_WORKER_CONCURRENCY="8", **extra)
    cpu = _env(redis_url, tmp, SPLATQ_STAGES=CPU_STAGES, SPLATQ_WORKER_CONCURRENCY="4", **extra)
    return [
        _spawn(["worker"], gpu, tmp / "worker-gpu.log"),
        _spawn(["worker"], cpu, tmp / "worker-cpu.log"),
    ]


@dataclass
class ModeResult:
    mode: str
    unloaded: list[float]
    loaded: list[float]
    full_done: int
    full_seconds: float

    @property
    def ratio(self) -> float:
        return statistics.median(self.loaded) / statistics.median(self.unloaded)


async def measure(
    client: Client,
    mode: str,
    flood: int,
    previews: int,
    every_s: float,
    unloaded_n: int,
    redis: Any = None,
) -> ModeResult:
    image = sample_png(1)
    # warm-up: each kind of job once (model load, first renders)
    await client.submit("preview", image, wait_s=120)
    await client.submit("full", image, wait_s=120)
    unloaded = [(await client.submit("preview", image, wait_s=120))[0] for _ in range(unloaded_n)]
    in_flight: list[str] = []
    finished = 0
    stop = asyncio.Event()
    flood_started = time.monotonic()

    async def keep_flooding() -> None:
        nonlocal finished
        while not stop.is_set():
            still = []
            for job_id in in_flight:
                if await client.status(job_id) in ("completed", "failed", "canceled"):
                    finished += 1
                else:
                    still.append(job_id)
            in_flight[:] = still
            while len(in_flight) < flood:
                _, body = await client.submit("full", image)
                in_flight.append(str(body["id"]))
            await asyncio.sleep(0.5)

    flooder = asyncio.create_task(keep_flooding())
    await asyncio.sleep(every_s)  # the flood is under way before the first preview
    loaded: list[float] = []
    for _ in range(previews):
        took, body = await client.submit("preview", image, wait_s=120)
        if body.get("status") != "completed":
            raise RuntimeError(f"preview did not complete within the wait: {body}")
        loaded.append(took)
        if redis is not None and mode == "staged":
            print(f"  preview {took:.2f} s: {await stage_spans(redis, body['id'])}")
        await asyncio.sleep(max(0.0, every_s - took))
    stop.set()
    await flooder
    return ModeResult(mode, unloaded, loaded, finished, time.monotonic() - flood_started)


UP_MODES = {"up": "", "up-shared": "shared"}  # mode -> SPLATQ_UP_LAYOUT ('' = the default)


async def run(args: argparse.Namespace) -> None:
    modes = args.modes.split(",")
    up_modes = [m for m in modes if m in UP_MODES]
    if up_modes:
        await run_up(args, up_modes)
    if len(up_modes) < len(modes):
        await run_kept_flood(args, [m for m in modes if m not in UP_MODES])


async def run_up(args: argparse.Namespace, modes: list[str]) -> None:
    """The whole flood at once against `splatq up` per layout, in one run."""
    floods = [int(n) for n in args.floods.split(",")]
    image = sample_png(1)
    results: list[FloodResult] = []
    for mode in modes:
        with tempfile.TemporaryDirectory() as tmp_name:
            results += await run_floods(
                Path(tmp_name),
                UP_MODES[mode],
                floods,
                image,
                args.unloaded,
                args.previews,
                args.gap,
                args.breakdown,
                frozenset(int(n) for n in args.drain.split(",") if n),
            )
        print(f"{mode}: done", flush=True)
    for r in results:
        for line in r.breakdowns:
            print(f"  {r.layout} flood {r.flood}: preview {line}")
    print()
    machine = f"{os.cpu_count()} cpus, {platform.processor() or platform.machine()}"
    print(f"machine: {machine}, python {platform.python_version()}; `splatq up` defaults, "
          f"each flood submitted at once, previews one after another {args.gap} s apart "
          f"(<= {args.previews})")  # fmt: skip
    print()
    print("| layout | flood | previews | unloaded p50 / p95 (s) | under flood p50 / p95 (s) | "
          "ratio p50 | ratio p95 | flood done in (s) | full jobs/min | stack CPU s per full "
          "job | cores the stack had |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r.layout} | {r.flood} | {len(r.loaded)} | "
            f"{statistics.median(r.unloaded):.2f} / {p95(r.unloaded):.2f} | "
            f"{statistics.median(r.loaded):.2f} / {p95(r.loaded):.2f} | "
            f"{r.ratio_p50:.2f}x | {r.ratio_p95:.2f}x | "
            f"{f'{r.flood_seconds:.1f}' if r.flood_seconds else '-'} | "
            f"{f'{r.full_per_min:.2f}' if r.flood_seconds else '-'} | "
            f"{f'{r.cpu_per_full:.1f}' if r.flood_seconds else '-'} | "
            f"{f'{r.cpu_share:.2f}' if r.flood_seconds else '-'} |"
        )


async def run_kept_flood(args: argparse.Namespace, modes: list[str]) -> None:
    """A flood kept at `--flood` jobs in flight, per worker mode (workers spawned here)."""
    results: list[ModeResult] = []
    extra = dict(kv.split("=", 1) for kv in args.env)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        server = RedisServer(tmp / "redis", appendonly=False)
        await server.start()
        redis = connect(server.url)
        try:
            for mode in modes:
                await redis.flushall()
                async with gateway(server.url, tmp) as client:
                    procs = start_workers(mode, server.url, tmp, extra)
                    try:
                        r = await measure(
                            client,
                            mode,
                            args.flood,
                            args.previews,
                            args.every,
                            args.unloaded,
                            redis if args.breakdown else None,
                        )
                    finally:
                        _stop(procs)
                results.append(r)
                print(f"{mode}: done", flush=True)
        finally:
            await redis.aclose()
            await server.stop()
    print()
    print(f"machine: {os.cpu_count()} cpus, {platform.processor() or platform.machine()}, "
          f"python {platform.python_version()}; flood {args.flood} full jobs in flight, "
          f"a preview every {args.every} s; extra env {extra or '-'}")  # fmt: skip
    print()
    print("| mode | preview unloaded p50 (s) | under flood p50 (s) | max (s) | ratio p50 | "
          "full jobs finished (per min) |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for r in results:
        per_min = r.full_done / r.full_seconds * 60
        print(
            f"| {r.mode} | {statistics.median(r.unloaded):.2f} | "
            f"{statistics.median(r.loaded):.2f} | {max(r.loaded):.2f} | {r.ratio:.2f}x | "
            f"{r.full_done} ({per_min:.1f}) |"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--modes", default="whole-even,staged-even,whole,staged")
    p.add_argument("--flood", type=int, default=6, help="full jobs kept in flight")
    p.add_argument("--previews", type=int, default=8, help="previews measured under the flood")
    p.add_argument("--every", type=float, default=3.0, help="seconds between loaded previews")
    p.add_argument("--unloaded", type=int, default=5, help="previews measured unloaded")
    p.add_argument("--env", action="append", default=[], help="SPLATQ_X=value for workers")
    p.add_argument("--breakdown", action="store_true", help="print each loaded preview's stages")
    p.add_argument("--floods", default="16,48", help="up*: full jobs submitted at once, per flood")
    p.add_argument("--gap", type=float, default=0.5, help="up*: seconds between loaded previews")
    p.add_argument(
        "--drain",
        default="16",
        help="up*: flood sizes waited out for the full jobs' throughput (others: previews only, "
        "the stack stopped with the flood in flight; such a flood must come last)",
    )
    asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    main()
