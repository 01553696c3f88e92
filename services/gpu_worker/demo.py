"""`make demo`: submit the bundled sample image to a running stack, follow its events, copy
the artifacts to ./out/ and verify them.

Talks to the engine directly (enqueue + events stream); when the gateway lands the demo will
go through the HTTP API and the `splatq submit` client instead.
"""

from __future__ import annotations

import asyncio
import hashlib
import sys
from pathlib import Path

import orjson
from redis.asyncio import Redis

from services.gpu_worker import formats
from services.gpu_worker.artifacts import ARTIFACT_FILES, PREVIEW_MAX_SIZE
from shared.ids import partition_of
from shared.jobs import JobSpec
from shared.queue import JobQueue
from shared.redis_client import connect
from shared.settings import Settings
from shared.storage import artifact_key, input_key, open_storage

SAMPLE = Path(__file__).resolve().parent / "samples" / "sample.png"
TERMINAL = {"completed", "failed", "canceled"}


async def run_demo(settings: Settings, out_dir: Path, quality: str = "preview") -> int:
    storage = open_storage(settings.storage_url, settings.storage_root)
    data = SAMPLE.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    key = input_key(digest, "png")
    await storage.put_bytes(key, data)
    redis = connect(settings.redis_url)
    queue = JobQueue(redis, settings)
    await queue.setup()
    try:
        result = await queue.enqueue(
            JobSpec(
                tenant="demo",
                quality=quality,
                input_ref=key,
                input_sha256=digest,
                metadata={"source": "make demo"},
            )
        )
        job_id = result.job_id
        print(f"submitted {SAMPLE.name} as {job_id} ({quality})", flush=True)
        status = await _follow(redis, queue, job_id)
        job = await queue.get(job_id)
        if job is None or status != "completed":
            err = job.error if job else None
            print(f"job ended {status}: {err.code if err else ''} {err.message if err else ''}")
            return 1
        files = {
            name: await storage.get_bytes(artifact_key(job_id, filename))
            for name, filename in ARTIFACT_FILES.items()
        }
        await asyncio.to_thread(_write_out, out_dir, files)
        raw_count = await redis.hget(queue.keys.job(job_id), "gaussian_count")  # type: ignore[misc]
        count = int(raw_count or 0)
        ply = formats.verify_ply(files["gaussian_ply"], expected_count=count)
        formats.verify_splat(files["splat"], expected_count=count)
        size = min(PREVIEW_MAX_SIZE, 128 if quality == "preview" else 512)
        formats.verify_png(files["rendered_preview"], size, size)
        print(
            f"verified: {ply.count} Gaussians; artifacts in {out_dir}/: "
            + ", ".join(ARTIFACT_FILES.values())
        )
        print(f"compute time {job.compute_time_ms} ms, model {job.model}")
        return 0
    finally:
        await redis.aclose()


def _write_out(out_dir: Path, files: dict[str, bytes]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (out_dir / ARTIFACT_FILES[name]).write_bytes(data)


async def _follow(redis: Redis, queue: JobQueue, job_id: str, timeout_s: float = 900) -> str:
    """Print the job's events as they arrive (XREAD BLOCK on its events stream)."""
    stream = queue.keys.events(partition_of(job_id))
    last = "0-0"
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        reply = await redis.xread({stream: last}, block=1000, count=100)
        for _, entries in reply or []:
            for entry_id, fields in entries:
                last = entry_id
                if fields.get("job_id") != job_id:
                    continue
                payload = orjson.loads(fields["payload"])
                kind = fields["type"].rsplit(".", 1)[1]
                extra = payload["data"].get("progress")
                stage = payload["data"].get("stage", "")
                line = f"  {kind:<10}" + (f" {extra:>4.0%} {stage}" if extra is not None else "")
                print(line, flush=True)
                if kind in TERMINAL:
                    return str(kind)
    print("timed out waiting for the job", file=sys.stderr)
    return "timeout"
