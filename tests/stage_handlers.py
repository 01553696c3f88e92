"""Stage handlers for pipeline tests, steered by the job's metadata; loadable by worker
subprocesses (`--stages all --stage-handlers tests.stage_handlers:make`).

Each stage's work is tiny and derived from its upstream output, so the result is checkable.
Every time a stage's work really runs (not skipped by the ledger, not reused), it INCRs
`test:stagework:<job>:<stage>`, so tests count executions across processes.

Metadata:
  {"slow": {"<stage>": seconds}}          sleep inside the work
  {"fail_after_work": {"<stage>": code}}  raise a TransientError (code) after the work wrote
                                          its outputs, on the stage's first run only
  {"fail": {"<stage>": code}}             raise a PermanentError (code) in the stage, on its
                                          first run only
  {"kill_after_work": ["<stage>", ...]}   SIGKILL this process after the stage's work wrote
                                          its outputs (before its commit), once per stage
  {"kill_before_meter": ["<stage>", ...]} the same, between storing the outputs and metering
                                          them (shared/engine/metering.py)
  {"poison": ["<stage>", ...]}            a poison job: every run of the stage SIGKILLs its
                                          process before any work, once the test allows it:
                                          run n (counted in `poison_runs_key`) waits until
                                          `poison_key` (an integer the test sets) reaches n
  {"slow_once": {"<stage>": seconds}}     sleep at the start of the stage's first run only
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
from typing import Any

from splatq.shared.engine.intermediates import IntermediateStore
from splatq.shared.engine.job_context import JobContext, JobHandler
from splatq.shared.engine.jobs import JobOutcome, StageDone
from splatq.shared.engine.metering import total_ms
from splatq.shared.engine.stages import PipelineStage, stage_digest
from splatq.shared.errors import PermanentError, TransientError
from splatq.shared.settings import Settings
from splatq.shared.storage.store import Storage, open_storage

UPSTREAM = {
    PipelineStage.RECONSTRUCT: PipelineStage.INGEST,
    PipelineStage.EXPORT: PipelineStage.RECONSTRUCT,
    PipelineStage.RENDER: PipelineStage.RECONSTRUCT,
}


def work_key(job_id: str, stage: str) -> str:
    return f"test:stagework:{job_id}:{stage}"


def poison_key(job_id: str) -> str:
    """How many runs of a poison stage may kill their process (the test raises it)."""
    return f"test:poison:{job_id}"


def poison_runs_key(job_id: str, stage: str) -> str:
    """How many runs of a poison stage have started (each waits for its turn to kill)."""
    return f"test:poisonrun:{job_id}:{stage}"


def expected_result(job_id: str) -> str:
    """What publish reports for a job: a function of its id through every stage."""
    image = hashlib.sha256(job_id.encode()).hexdigest()
    gaussians = hashlib.sha256(f"g:{image}".encode()).hexdigest()
    return f"{gaussians[:16]}|{gaussians[-16:]}"


class ToyStages:
    def __init__(self, storage: Storage) -> None:
        self.store = IntermediateStore(storage)
        self.handlers: dict[PipelineStage, JobHandler] = {
            s: self._make(s)
            for s in (
                PipelineStage.INGEST,
                PipelineStage.RECONSTRUCT,
                PipelineStage.EXPORT,
                PipelineStage.RENDER,
            )
        }
        self.handlers[PipelineStage.PUBLISH] = self.publish

    def handler(self, stage: PipelineStage) -> JobHandler:
        return self.handlers[stage]

    async def startup(self, stages: tuple[PipelineStage, ...]) -> None:
        return None

    async def shutdown(self) -> None:
        return None

    async def cleanup(self, job_id: str) -> int:
        return await self.store.delete_job(job_id)

    async def _once(self, ctx: JobContext, what: str, stage: PipelineStage) -> bool:
        """True the first time this (job, stage, what) is asked, across processes."""
        key = f"test:once:{ctx.job.id}:{stage.value}:{what}"
        return bool(await ctx.queue.redis.set(key, "1", nx=True, ex=3600))

    async def _hazards(self, ctx: JobContext, stage: PipelineStage) -> None:
        """What the metadata asks of a run at its start: a poison kill, a first-run sleep."""
        meta: dict[str, Any] = dict(ctx.job.metadata)
        redis = ctx.queue.redis
        if stage.value in meta.get("poison", []):
            run = await redis.incr(poison_runs_key(ctx.job.id, stage.value))
            # the go-ahead comes from the test process, through Redis
            while int(await redis.get(poison_key(ctx.job.id)) or 0) < run:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
            os.kill(os.getpid(), signal.SIGKILL)
        seconds = meta.get("slow_once", {}).get(stage.value)
        if seconds and await self._once(ctx, "slow_once", stage):
            await asyncio.sleep(float(seconds))

    def _make(self, stage: PipelineStage) -> JobHandler:
        async def run(ctx: JobContext) -> StageDone:
            await self._hazards(ctx, stage)
            meta: dict[str, Any] = dict(ctx.job.metadata)
            if stage.value in meta.get("fail", {}) and await self._once(ctx, "fail", stage):
                raise PermanentError("told to fail", code=meta["fail"][stage.value])
            upstream = UPSTREAM.get(stage)
            if upstream is None:
                source_digest = ctx.job.id
                record = None
            else:
                record = self.store.upstream(ctx.job, upstream)
                source_digest = record.digest
            digest = stage_digest(source_digest, stage.value, "toy-1")

            async def work() -> tuple[dict[str, bytes], dict[str, str]]:
                await ctx.queue.redis.incr(work_key(ctx.job.id, stage.value))
                await asyncio.sleep(float(meta.get("slow", {}).get(stage.value, 0)))
                if record is None:
                    out = hashlib.sha256(ctx.job.id.encode()).hexdigest().encode()
                else:
                    data = await self.store.read(record, "out")
                    if stage is PipelineStage.RECONSTRUCT:
                        out = hashlib.sha256(b"g:" + data).hexdigest().encode()
                    elif stage is PipelineStage.EXPORT:
                        out = data[:16]
                    else:
                        out = data[-16:]
                return {"out": out}, {"stage": stage.value}

            async def meter(unit: str, ms: int) -> None:
                if stage.value in meta.get("kill_before_meter", []) and await self._once(
                    ctx, "kill_before_meter", stage
                ):
                    os.kill(os.getpid(), signal.SIGKILL)
                await ctx.meter(unit, ms)

            done = await self.store.run_stage(ctx.job, stage, digest, ("out",), work, meter)
            if not done.skipped:
                if stage.value in meta.get("kill_after_work", []) and await self._once(
                    ctx, "kill", stage
                ):
                    os.kill(os.getpid(), signal.SIGKILL)
                code = meta.get("fail_after_work", {}).get(stage.value)
                if code and await self._once(ctx, "fail_after_work", stage):
                    raise TransientError("told to fail after the work", code=code)
            ctx.raise_if_stopped()
            return done

        return run

    async def publish(self, ctx: JobContext) -> JobOutcome:
        meta: dict[str, Any] = dict(ctx.job.metadata)
        stage = PipelineStage.PUBLISH
        await self._hazards(ctx, stage)
        if stage.value in meta.get("fail", {}) and await self._once(ctx, "fail", stage):
            raise PermanentError("told to fail", code=meta["fail"][stage.value])
        exported = await self.store.read(self.store.upstream(ctx.job, PipelineStage.EXPORT), "out")
        rendered = await self.store.read(self.store.upstream(ctx.job, PipelineStage.RENDER), "out")
        await ctx.queue.redis.incr(work_key(ctx.job.id, stage.value))
        await asyncio.sleep(float(meta.get("slow", {}).get(stage.value, 0)))
        if stage.value in meta.get("kill_after_work", []) and await self._once(ctx, "kill", stage):
            os.kill(os.getpid(), signal.SIGKILL)
        return JobOutcome(
            artifacts={"result": f"{exported.decode()}|{rendered.decode()}"},
            compute_time_ms=total_ms(ctx.job.metered),
            extra_fields={"publish_token": ctx.token},
        )


def make(settings: Settings) -> ToyStages:
    return ToyStages(open_storage(settings.storage_url, settings.storage_root))
