"""The whole flood at once, against the stack exactly as `splatq up` starts it (its defaults).

`splatq up` runs as a child process (embedded redis-server, gateway, its workers, dispatcher,
redriver, settler); only ports and the data directory are chosen here, plus
`SPLATQ_UP_LAYOUT` for the layout being compared. Per flood size N: N full jobs submitted at
once (a 429 is retried after its Retry-After, as a client would), then previews one after
another while the flood lasts; then the flood is waited out. Used by bench/pipeline.py
(`--modes up,up-shared`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.up_stack import UpStack, job_form, splatq_up
from splatq.shared.engine.jobs import JobRecord
from splatq.shared.engine.keys import KeySchema
from splatq.shared.redis.client import connect

REPO_ROOT = Path(__file__).resolve().parent.parent
TERMINAL = ("completed", "failed", "canceled")


@dataclass
class UpClient:
    http: aiohttp.ClientSession
    stack: UpStack
    retried_429: int = 0

    async def submit(self, quality: str, image: bytes, wait_s: int = 0) -> tuple[float, dict]:
        """(seconds, body) of one submission; a 429 is retried after its Retry-After."""
        started = time.monotonic()
        while True:
            form, headers = job_form(quality, image, self.stack.api_key, wait_s)
            url = f"{self.stack.base}/v1/jobs"
            async with self.http.post(url, data=form, headers=headers) as resp:
                body = await resp.json()
                if resp.status == 429:
                    self.retried_429 += 1
                    await asyncio.sleep(float(resp.headers.get("Retry-After", "1")))
                    continue
                if resp.status not in (200, 202):
                    raise RuntimeError(f"submit answered {resp.status}: {body}")
            return time.monotonic() - started, body


@dataclass
class FloodResult:
    layout: str
    flood: int
    unloaded: list[float]
    loaded: list[float] = field(default_factory=list)
    flood_seconds: float = 0.0  # first submission to the last full job's end (0: not waited)
    # CPU seconds every process of the stack used meanwhile (the previews' included): what
    # the flood cost, whatever share of a shared machine the stack got
    cpu_seconds: float = 0.0
    breakdowns: list[str] = field(default_factory=list)

    @property
    def ratio_p50(self) -> float:
        return statistics.median(self.loaded) / statistics.median(self.unloaded)

    @property
    def ratio_p95(self) -> float:
        return p95(self.loaded) / p95(self.unloaded)

    @property
    def cpu_per_full(self) -> float:
        return self.cpu_seconds / self.flood

    @property
    def cpu_share(self) -> float:
        """Cores the stack had on average during the flood (CPU seconds / wall seconds)."""
        return self.cpu_seconds / self.flood_seconds if self.flood_seconds else 0.0

    @property
    def full_per_min(self) -> float:
        return self.flood / self.flood_seconds * 60 if self.flood_seconds else 0.0


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


async def stage_spans(redis: Any, job_id: str) -> str:
    """'stage +wait run' in ms for each stage of a finished staged job (its ledger)."""
    job = JobRecord.from_hash(await redis.hgetall(KeySchema().job(job_id)))
    spans = [
        (stage.value, r.started_at_ms or 0, r.finished_at_ms or 0)
        for stage, r in job.ledger.items()
        if stage.value != "cleanup"
    ]
    spans.append(("publish", job.started_at_ms or 0, job.completed_at_ms or 0))
    parts, last = [], job.created_at_ms
    for name, start, end in spans:
        parts.append(f"{name} +{start - last} {end - start}")
        last = end
    return ", ".join(parts)


def stack_cpu_seconds(root: int) -> float:
    """User + system CPU seconds of `root` and every process below it (Linux /proc)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents[int(stat.parent.name)] = int(fields[1])
    tree, frontier = {root}, [root]
    while frontier:
        pid = frontier.pop()
        children = [c for c, parent in parents.items() if parent == pid and c not in tree]
        tree.update(children)
        frontier.extend(children)
    ticks = 0
    for pid in tree:
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


async def _all_done(redis: Any, job_ids: list[str]) -> bool:
    keys = KeySchema()
    async with redis.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.hget(keys.job(job_id), "status")
        statuses = await pipe.execute()
    return all((s.decode() if isinstance(s, bytes) else s) in TERMINAL for s in statuses)


async def _last_end_ms(redis: Any, job_ids: list[str]) -> int:
    keys = KeySchema()
    ends = []
    for job_id in job_ids:
        job = JobRecord.from_hash(await redis.hgetall(keys.job(job_id)))
        if job.status.value != "completed":
            raise RuntimeError(f"full job {job_id} ended {job.status.value}")
        ends.append(job.completed_at_ms or 0)
    return max(ends)


async def run_floods(
    tmp: Path,
    layout: str,
    floods: list[int],
    image: bytes,
    unloaded_n: int,
    max_previews: int,
    gap_s: float,
    breakdown: bool,
    drain: frozenset[int] = frozenset(),
) -> list[FloodResult]:
    """One `splatq up` (layout `layout`; '' = its default): warm-up, then per flood the
    unloaded previews and the flood (previews one after another while it lasts, `gap_s` apart, at
    most `max_previews`); a flood whose size is in `drain` is waited out (its throughput),
    and must be the last one otherwise (the stack stops with it in flight)."""
    results = []
    async with splatq_up(tmp, {"SPLATQ_UP_LAYOUT": layout} if layout else None) as stack:
        redis = connect(stack.redis_url)
        timeout = aiohttp.ClientTimeout(total=900)
        try:
            async with aiohttp.ClientSession(timeout=timeout) as http:
                client = UpClient(http, stack)
                await client.submit("preview", image, wait_s=120)  # warm-up: model, renders
                await client.submit("full", image, wait_s=300)
                for n in floods:
                    # unloaded right before each flood: the machine's load drifts
                    unloaded = [
                        (await client.submit("preview", image, wait_s=120))[0]
                        for _ in range(unloaded_n)
                    ]
                    r = FloodResult(layout or "default", n, unloaded)
                    drained = n in drain
                    cpu_before = stack_cpu_seconds(stack.proc.pid)
                    await _one_flood(
                        client, redis, r, image, max_previews, gap_s, breakdown, drained
                    )
                    r.cpu_seconds = stack_cpu_seconds(stack.proc.pid) - cpu_before
                    results.append(r)
                    print(f"{r.layout} flood {n}: preview p50 {statistics.median(r.loaded):.2f} s "
                          f"(unloaded {statistics.median(unloaded):.2f} s, {r.ratio_p50:.2f}x), "
                          f"flood done in {r.flood_seconds:.0f} s (0: not waited)",
                          flush=True)  # fmt: skip
        finally:
            await redis.aclose()
    return results


async def _one_flood(
    client: UpClient,
    redis: Any,
    r: FloodResult,
    image: bytes,
    max_previews: int,
    gap_s: float,
    breakdown: bool,
    drained: bool,
) -> None:
    started_ms = int(time.time() * 1000)
    bodies = await asyncio.gather(*(client.submit("full", image) for _ in range(r.flood)))
    full_ids = [str(body["id"]) for _, body in bodies]
    while len(r.loaded) < max_previews and not await _all_done(redis, full_ids):
        took, body = await client.submit("preview", image, wait_s=120)
        if body.get("status") != "completed":
            raise RuntimeError(f"preview did not complete within the wait: {body}")
        r.loaded.append(took)
        if breakdown:
            r.breakdowns.append(f"{took:.2f} s: {await stage_spans(redis, str(body['id']))}")
        await asyncio.sleep(gap_s)
    if not r.loaded:
        raise RuntimeError("the flood ended before a preview was measured")
    if not drained:
        return
    while not await _all_done(redis, full_ids):  # noqa: ASYNC110 - polling another process
        await asyncio.sleep(0.5)
    r.flood_seconds = (await _last_end_ms(redis, full_ids) - started_ms) / 1000
