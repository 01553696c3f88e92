"""Job handlers for tests, steered by the job's metadata; loadable by worker subprocesses
(`--handler tests.handlers:make`).

Each run INCRs `test:runs:<job_id>` so tests can count executions, not just commits.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from splatq.shared.engine.job_context import JobContext, JobHandler
from splatq.shared.engine.jobs import JobOutcome
from splatq.shared.errors import PermanentError, TransientError
from splatq.shared.settings import Settings
from splatq.shared.storage.store import (
    ARTIFACT_FILES,
    Storage,
    artifact_key,
    artifact_run,
    open_storage,
)


def runs_key(job_id: str) -> str:
    return f"test:runs:{job_id}"


_COUNT_ONCE = """
if redis.call('SET', KEYS[1], '1', 'NX', 'EX', 3600) then return redis.call('INCR', KEYS[2]) end
return 0
"""


async def _count_run(ctx: JobContext) -> None:
    """Count this run (tests assert how many runs a job had). The counter is the test's
    instrument, not part of the system under test: while Redis is unreachable (the outage
    tests) it waits and tries again instead of failing the job; a resend after a lost reply
    counts once (the run's lease token marks it)."""
    deadline = time.monotonic() + 60
    # "{<key>}:<token>" hashes to the slot of <key> itself (Redis Cluster: one slot per script)
    marker = f"{{{runs_key(ctx.job.id)}}}:{ctx.token}"
    while True:
        try:
            await ctx.queue.redis.eval(_COUNT_ONCE, 2, marker, runs_key(ctx.job.id))
            return
        except (RedisConnectionError, RedisTimeoutError, OSError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


class BehaviourHandler:
    """metadata keys: sleep_s (async, with progress every 0.1 s), block_s (blocking work in a
    thread), fail ('permanent' | 'transient' | 'transient_once'), crash (SIGKILL own process),
    crash_after_s (SIGKILL after sleeping), first_sleep_s (sleep on the first attempt only),
    loop_block_s (a bug on purpose: time.sleep on the event loop, which stops it),
    stdlib_log (a line through standard-library logging, as a library would write it),
    artifacts (write the contract's artifact files, small fixed bytes naming the job, to
    storage, as the GPU worker lays them out, so the gateway can serve them)."""

    def __init__(self, storage: Storage | None = None, base_url: str = "") -> None:
        self.storage = storage
        self.base_url = base_url

    async def __call__(self, ctx: JobContext) -> JobOutcome:
        meta: dict[str, Any] = dict(ctx.job.metadata)
        await _count_run(ctx)
        if meta.get("crash"):
            os.kill(os.getpid(), signal.SIGKILL)
        fail = meta.get("fail")
        if fail == "permanent":
            raise PermanentError("input is corrupt", code="INPUT_CORRUPT")
        if fail == "transient" or (fail == "transient_once" and ctx.attempt == 1):
            raise TransientError("storage timed out", code="STORAGE_TIMEOUT")
        if "first_sleep_s" in meta and ctx.attempt == 1:
            await asyncio.sleep(float(meta["first_sleep_s"]))
        if "stdlib_log" in meta:
            logging.getLogger("tests.library").warning("library says %s", meta["stdlib_log"])
        if "loop_block_s" in meta:
            time.sleep(float(meta["loop_block_s"]))  # noqa: ASYNC251 - the point of the test
        if "block_s" in meta:
            await ctx.run_blocking(time.sleep, float(meta["block_s"]))
        sleep_s = float(meta.get("sleep_s", 0))
        steps = max(int(sleep_s / 0.1), 1) if sleep_s else 0
        for i in range(steps):
            await asyncio.sleep(sleep_s / steps)
            await ctx.progress((i + 1) / (steps + 1), f"step-{i}")
        if "crash_after_s" in meta:
            await asyncio.sleep(float(meta["crash_after_s"]))
            os.kill(os.getpid(), signal.SIGKILL)
        if meta.get("artifacts") and self.storage is not None:
            return await self._write_artifacts(ctx)
        return JobOutcome(artifacts={"result": f"mem://{ctx.job.id}/result"}, model="test-model")

    async def _write_artifacts(self, ctx: JobContext) -> JobOutcome:
        assert self.storage is not None
        run = artifact_run(ctx.attempt)
        urls = {}
        for name, filename in ARTIFACT_FILES.items():
            await self.storage.put_bytes(
                artifact_key(ctx.job.id, filename, run), artifact_bytes(ctx.job.id, name)
            )
            urls[name] = f"{self.base_url}/v1/jobs/{ctx.job.id}/artifacts/{name}"
        return JobOutcome(artifacts=urls, model="test-model", extra_fields={"artifact_run": run})


def artifact_bytes(job_id: str, name: str) -> bytes:
    """What the test handler writes as artifact `name` of a job."""
    return f"{name} of {job_id}".encode()


def make(settings: Settings) -> JobHandler:
    storage = open_storage(
        settings.storage_url, settings.storage_root, s3_endpoint_url=settings.s3_endpoint_url
    )
    return BehaviourHandler(storage, settings.public_base_url)
