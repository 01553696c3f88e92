"""Stage outputs of the staged pipeline: the ledger skip and content-addressed reuse that every
stage runs in, over any `Storage`.

A stage computes the digest of its inputs (its upstream output digest, version, profile) and
calls `IntermediateStore.run_stage`: a succeeded ledger record for that digest whose outputs
still exist is a skip (a redrive resumes where the job failed); outputs an earlier run of the
stage finished writing are reused (a crash or a failure after the work but before the advance
commit repeats no work); otherwise the work runs and each output is written atomically, the
`facts.json` marker last, so its presence means every output of that digest is whole.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable, Mapping

import orjson
import structlog

from splatq.shared.engine.jobs import JobRecord, StageDone
from splatq.shared.engine.metering import stage_unit
from splatq.shared.engine.stages import PipelineStage, StageRecord, StageStatus, stage_digest
from splatq.shared.errors import PermanentError
from splatq.shared.storage.store import Storage, intermediate_key, intermediate_prefix

log = structlog.get_logger("splatq.intermediates")

# The work of one stage: its output files by name, and small facts for later stages.
StageWork = Callable[[], Awaitable[tuple[dict[str, bytes], dict[str, str]]]]
# Records a unit of work with its measured ms (a run's `JobContext.meter`).
Meter = Callable[[str, int], Awaitable[object]]
FACTS = "facts.json"
# The marker's record of the time the run that made the outputs measured (not a fact for
# later stages: read back and removed when the outputs are reused).
WORK_MS_FACT = "_work_ms"
# A fact a stage's work may return: the ms its unit is metered with instead of the time the
# work took here (the work ran elsewhere: a hosted model's vendor-reported time or cost).
CHARGED_MS_FACT = "_charged_ms"


class IntermediateMissing(PermanentError):
    """A stage's input (an earlier stage's output) is gone: retention removed it, or the job
    was redriven past a stage that never produced it. A redrive with `--from-stage` of the
    stage that produces it makes it again."""

    code = "INTERMEDIATE_MISSING"


class IntermediateStore:
    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        # Stage runs that did their work (not skipped, not reused), by stage: tests read it.
        self.work_done: dict[PipelineStage, int] = dict.fromkeys(PipelineStage, 0)

    async def run_stage(
        self,
        job: JobRecord,
        stage: PipelineStage,
        digest: str,
        names: tuple[str, ...],
        work: StageWork,
        meter: Meter | None = None,
    ) -> StageDone:
        """Skip, reuse or do the stage's work (see the module). `meter` (the run's
        `JobContext.meter`) records the unit of work the outputs are: as soon as they are
        stored, or on a reuse with the time of the run that made them -- which records it only
        if that run died before it could (shared/engine/metering.py)."""
        done = await self._run_stage(job, stage, digest, names, work)
        if meter is not None and done.work_ms is not None:
            await meter(stage_unit(stage.value, done.digest), done.work_ms)
        return done

    async def _run_stage(
        self,
        job: JobRecord,
        stage: PipelineStage,
        digest: str,
        names: tuple[str, ...],
        work: StageWork,
    ) -> StageDone:
        digest = self.effective_digest(job, stage, digest)
        done = job.ledger.get(stage)
        if (
            done is not None
            and self.recorded(job, stage, digest)
            and await self.all_exist(done.outputs.values())
        ):
            log.info("stage.skipped", job_id=job.id, stage=stage.value, reason="ledger")
            return StageDone(
                digest, done.outputs, skipped=True, work_ms=done.work_ms, facts=done.facts
            )
        keys = {name: intermediate_key(job.id, stage.value, digest, name) for name in names}
        facts_key = intermediate_key(job.id, stage.value, digest, FACTS)
        if await self.all_exist([*keys.values(), facts_key]):
            facts = orjson.loads(await self.storage.get_bytes(facts_key))
            # The run that made the outputs recorded its work time in the marker: the reuse
            # carries it (metering counts the unit once, whichever run records it first).
            made_ms = facts.pop(WORK_MS_FACT, None)
            log.info("stage.skipped", job_id=job.id, stage=stage.value, reason="outputs_exist")
            return StageDone(
                digest,
                keys,
                skipped=True,
                reused=True,
                work_ms=made_ms if isinstance(made_ms, int) else None,
                facts=facts,
            )
        started = time.monotonic()
        files, facts = await work()
        work_ms = round((time.monotonic() - started) * 1000)
        if CHARGED_MS_FACT in facts:
            # Work done elsewhere and charged by its own measure (a hosted model's time or
            # cost as its vendor reports it), not by how long this run waited for it.
            facts = dict(facts)
            work_ms = int(facts.pop(CHARGED_MS_FACT))
        for name, key in keys.items():
            await self.storage.put_bytes(key, files[name])
        await self.storage.put_bytes(facts_key, orjson.dumps({**facts, WORK_MS_FACT: work_ms}))
        self.work_done[stage] += 1
        return StageDone(digest, keys, work_ms=work_ms, facts=facts)

    @staticmethod
    def effective_digest(job: JobRecord, stage: PipelineStage, digest: str) -> str:
        """The digest a stage's outputs are stored under: its inputs' digest, with the nonce
        of a redrive that asked this stage to run again (`rerun.<stage>`)."""
        rerun = job.reruns.get(stage.value)
        if rerun:
            # a redrive from this stage (or an earlier one) asked for a fresh run
            return stage_digest(digest, "rerun", rerun)
        return digest

    @staticmethod
    def recorded(job: JobRecord, stage: PipelineStage, digest: str) -> bool:
        """The job's ledger holds a success of `stage` for this (effective) digest: the
        stage's advance committed for these inputs already."""
        done = job.ledger.get(stage)
        return done is not None and done.status is StageStatus.SUCCEEDED and done.digest == digest

    async def all_exist(self, keys: Iterable[str]) -> bool:
        for key in keys:
            if not await self.storage.exists(key):
                return False
        return True

    @staticmethod
    def upstream(job: JobRecord, stage: PipelineStage) -> StageRecord:
        """The ledger record of the stage whose outputs the running stage reads."""
        record = job.ledger.get(stage)
        if record is None or record.status is not StageStatus.SUCCEEDED:
            raise IntermediateMissing(
                f"the {stage.value} stage has no recorded success for this job; redrive it "
                f"with --from-stage {stage.value}"
            )
        return record

    async def read(self, record: StageRecord, name: str) -> bytes:
        key = record.outputs.get(name, "")
        if not key or not await self.storage.exists(key):
            raise IntermediateMissing(
                f"intermediate {name!r} is gone; redrive the job with --from-stage of the "
                "stage that produced it"
            )
        return await self.storage.get_bytes(key)

    async def delete_job(self, job_id: str) -> int:
        """Delete a job's intermediates (idempotent); returns how many objects went."""
        deleted = 0
        async for obj in self.storage.list_objects(intermediate_prefix(job_id)):
            await self.storage.delete(obj.key)
            deleted += 1
        return deleted


def facts_int(facts: Mapping[str, str], name: str) -> int:
    raw = facts.get(name, "")
    return int(raw) if raw.isdigit() else 0
