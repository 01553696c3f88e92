"""A run's outcome as the commit that records it (pure: no I/O, no clock, no logging). The
worker decides *that* a run ended (a result, an error, a cancel, a deferral); this module
says *what* is written -- the target state, the event and its fields, the claim's status,
the retry's delay, the dead-letter code -- as a `Finish` for the commit script."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from splatq.shared.engine import artifact_refs, events
from splatq.shared.engine.events import EventType
from splatq.shared.engine.job_context import JobContext
from splatq.shared.engine.jobs import JobOutcome, StageDone
from splatq.shared.engine.metering import METER_PREFIX, WHOLE_JOB_UNIT
from splatq.shared.engine.queue_types import Advance, Finish
from splatq.shared.engine.retries import RetryDecision
from splatq.shared.engine.stages import PIPELINE, PipelineStage, StageRecord, StageStatus
from splatq.shared.errors import INVALID_OUTCOME, Deferred, ErrorInfo


def finish_of(ctx: JobContext, target: str, **kw: Any) -> Finish:
    """The commit that moves the run's job to `target` (fenced by the run's lease token)."""
    return Finish(
        job_id=ctx.job.id,
        stream=ctx.stream,
        entry_id=ctx.entry.entry_id,
        token=ctx.token,
        target=target,
        claim_key=ctx.job.claim_key,
        **kw,
    )


def deferred(ctx: JobContext, exc: Deferred) -> Finish:
    """A handler's "not now" (errors.Deferred): the job is parked on the delayed set for the
    delay, and the attempt and the delivery this run used are written back in the same fenced
    commit (a run that lost its job commits nothing, so the counts it read at its start are
    still the job's)."""
    fields = {
        "attempts": str(max(ctx.job.attempts - 1, 0)),
        "deliveries": str(max(ctx.job.deliveries - 1, 0)),
        "deferrals": str(ctx.job.deferrals + 1),
        "deferred_reason": exc.reason[:200],
    }
    return finish_of(ctx, "retrying", retry_delay_ms=exc.delay_ms, fields=fields)


def success(
    ctx: JobContext, outcome: JobOutcome, elapsed_ms: int, *, whole_job: bool
) -> Finish | ErrorInfo:
    """The completing commit, or the error an outcome that cannot be stored is (permanent).
    `elapsed_ms` is the compute time when the handler reported none; a whole job (not a
    stage of a pipeline) is metered as one unit with its completion (a staged job's stages
    meter their own units as they finish them)."""
    problem = outcome.problem() if isinstance(outcome, JobOutcome) else "not a JobOutcome"
    if problem is not None:
        return ErrorInfo(
            INVALID_OUTCOME, f"the handler's outcome cannot be stored: {problem}", False
        )
    model = outcome.model or ctx.job.model
    compute_ms = outcome.compute_time_ms if outcome.compute_time_ms is not None else elapsed_ms
    fields: dict[str, str] = {
        **artifact_refs.record_fields(ctx.job.id, outcome.artifacts),
        "compute_time_ms": str(compute_ms),
        "model": model,
        **outcome.extra_fields,
    }
    if whole_job:
        fields[METER_PREFIX + WHOLE_JOB_UNIT] = str(compute_ms)
    return finish_of(
        ctx,
        "completed",
        event=EventType.COMPLETED.value,
        event_extra=events.completed_fields(model, compute_ms, outcome.artifacts),
        claim_status="COMPLETED",
        fields=fields,
    )


def failure(
    ctx: JobContext, info: ErrorInfo, decision: RetryDecision, dead_letter_codes: Collection[str]
) -> tuple[Finish, str]:
    """The commit of a failed run: a retry after `decision`'s delay, or the job's failure
    (dead-lettered when its code is one of `dead_letter_codes`); and which of the two."""
    error_fields: Mapping[str, str] = {
        "error_code": info.code,
        "error_message": info.message[:1000],
        "error_retryable": "1" if info.retryable else "0",
    }
    if decision.retry:
        commit = finish_of(ctx, "retrying", retry_delay_ms=decision.delay_ms, fields=error_fields)
        return commit, "retrying"
    return finish_of(
        ctx,
        "failed",
        event=EventType.FAILED.value,
        event_extra=events.failed_fields(info.code, info.message, info.retryable),
        claim_status="FAILED",
        fields=error_fields,
        dead_letter=info.code if info.code in dead_letter_codes else "",
    ), "failed"


def advance_of(
    ctx: JobContext, done: StageDone, stage: PipelineStage, after: PipelineStage, now_ms: int
) -> Advance:
    """The advance of a stage that succeeded: its ledger record and the job queued on
    `after`, with the progress and the stage event that says so."""
    record = StageRecord(
        status=StageStatus.SUCCEEDED,
        attempts=ctx.attempt,
        started_at_ms=ctx.job.started_at_ms,
        finished_at_ms=now_ms,
        digest=done.digest,
        outputs=done.outputs,
        skipped=done.skipped,
        work_ms=done.work_ms,
        facts=done.facts,
    )
    position = PIPELINE.index(stage) + 1
    return Advance(
        job_id=ctx.job.id,
        stream=ctx.stream,
        entry_id=ctx.entry.entry_id,
        token=ctx.token,
        stage=stage.value,
        next_stage=after.value,
        record=record.to_json(),
        progress=round(position / len(PIPELINE), 4),
        event_extra=events.stage_fields(
            position / len(PIPELINE), stage.value, StageStatus.SUCCEEDED.value, after.value
        ),
        also_event=done.also_event,
        also_extra=done.also_extra,
    )
