"""Job handlers for tests, steered by the job's metadata; loadable by worker subprocesses
(`--handler tests.handlers:make`).

Each run INCRs `test:runs:<job_id>` so tests can count executions, not just commits.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

from splatq.shared.engine.errors import PermanentError, TransientError
from splatq.shared.engine.jobs import JobOutcome
from splatq.shared.engine.worker import JobContext, JobHandler
from splatq.shared.settings import Settings


def runs_key(job_id: str) -> str:
    return f"test:runs:{job_id}"


class BehaviourHandler:
    """metadata keys: sleep_s (async, with progress every 0.1 s), block_s (blocking work in a
    thread), fail ('permanent' | 'transient' | 'transient_once'), crash (SIGKILL own process),
    crash_after_s (SIGKILL after sleeping), first_sleep_s (sleep on the first attempt only)."""

    async def __call__(self, ctx: JobContext) -> JobOutcome:
        meta: dict[str, Any] = dict(ctx.job.metadata)
        await ctx.queue.redis.incr(runs_key(ctx.job.id))
        if meta.get("crash"):
            os.kill(os.getpid(), signal.SIGKILL)
        fail = meta.get("fail")
        if fail == "permanent":
            raise PermanentError("input is corrupt", code="INPUT_CORRUPT")
        if fail == "transient" or (fail == "transient_once" and ctx.attempt == 1):
            raise TransientError("storage timed out", code="STORAGE_TIMEOUT")
        if "first_sleep_s" in meta and ctx.attempt == 1:
            await asyncio.sleep(float(meta["first_sleep_s"]))
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
        return JobOutcome(artifacts={"result": f"mem://{ctx.job.id}/result"}, model="test-model")


def make(settings: Settings) -> JobHandler:
    return BehaviourHandler()
