"""The API's `stages` object (stage_views) and the job view's staged members, from ledgers and
job hashes as the scripts write them: every status a stage can show, the times in the job
view's own RFC 3339 format, and a job never staged showing `{}`."""

from __future__ import annotations

from typing import Any

import pytest

from splatq.services.gateway.views import job_view, rfc3339
from splatq.shared.engine.jobs import JobRecord
from splatq.shared.engine.stages import (
    ALL_STAGES,
    LEDGER_PREFIX,
    PIPELINE,
    PipelineStage,
    StageContext,
    StageRecord,
    StageStatus,
    ledger_of,
    stage_views,
)

T0 = 1_764_581_400_000  # 2025-12-01T09:30:00Z in Unix ms
ERROR = {"code": "INTERMEDIATE_MISSING", "message": "gone", "retryable": False}


def done(stage_index: int, attempts: int = 1) -> StageRecord:
    """A succeeded record, as advance.lua writes it: stage i ran from T0+10i s for 5 s."""
    start = T0 + 10_000 * stage_index
    return StageRecord(
        StageStatus.SUCCEEDED, attempts, start, start + 5_000, digest=f"d{stage_index}"
    )


def ledger_until(stage: PipelineStage) -> dict[PipelineStage, StageRecord]:
    """Succeeded records of every job stage before `stage`."""
    return {s: done(i) for i, s in enumerate(PIPELINE[: PIPELINE.index(stage)])}


def ctx(stage: str, status: str, **kw: Any) -> StageContext:
    fields: dict[str, Any] = {
        "current_stage": stage,
        "status": status,
        "attempts": 1,
        "started_at_ms": T0 + 100_000,
        "completed_at_ms": None,
        "error": None,
        "dead_lettered": False,
    }
    fields.update(kw)
    return StageContext(**fields)


def statuses(views: dict[str, dict[str, Any]]) -> list[str]:
    return [views[s.value]["status"] for s in ALL_STAGES]


def test_a_job_never_staged_has_no_stages() -> None:
    assert stage_views({}, ctx("", "queued"), rfc3339) == {}
    assert stage_views({}, ctx("", "completed", completed_at_ms=T0), rfc3339) == {}


def test_the_running_stage_shows_the_jobs_run_and_later_ones_are_pending() -> None:
    ledger = ledger_until(PipelineStage.EXPORT)
    views = stage_views(ledger, ctx("export", "processing", attempts=2), rfc3339)
    assert list(views) == [s.value for s in ALL_STAGES]
    assert statuses(views) == ["succeeded", "succeeded", "running", "pending", "pending",
                               "pending"]  # fmt: skip
    assert views["export"] == {
        "status": "running",
        "attempts": 2,
        "started_at": rfc3339(T0 + 100_000),
        "finished_at": None,
        "error": None,
    }
    for later in ("render", "publish", "cleanup"):
        assert views[later] == {
            "status": "pending", "attempts": 0, "started_at": None, "finished_at": None,
            "error": None,
        }  # fmt: skip


def test_succeeded_stages_show_their_ledger_record_in_the_job_views_time_format() -> None:
    ledger = ledger_until(PipelineStage.RENDER)
    ledger[PipelineStage.RECONSTRUCT] = done(1, attempts=3)
    views = stage_views(ledger, ctx("render", "processing"), rfc3339)
    assert views["ingest"] == {
        "status": "succeeded",
        "attempts": 1,
        "started_at": "2025-12-01T09:30:00.000Z",
        "finished_at": "2025-12-01T09:30:05.000Z",
        "error": None,
    }
    assert views["reconstruct"]["attempts"] == 3
    assert views["reconstruct"]["started_at"] == rfc3339(T0 + 10_000)


def test_between_stages_the_next_stage_is_pending() -> None:
    """After an advance the job is queued on the next stage with a fresh attempt budget."""
    ledger = ledger_until(PipelineStage.RECONSTRUCT)
    views = stage_views(ledger, ctx("reconstruct", "queued", attempts=0), rfc3339)
    assert statuses(views)[:2] == ["succeeded", "pending"]
    assert views["reconstruct"]["attempts"] == 0
    assert views["reconstruct"]["started_at"] is None


def test_a_stage_waiting_for_its_retry_is_running_with_the_failed_attempts_error() -> None:
    views = stage_views(
        ledger_until(PipelineStage.RECONSTRUCT),
        ctx("reconstruct", "retrying", attempts=1, error=ERROR),
        rfc3339,
    )
    assert views["reconstruct"]["status"] == "running"
    assert views["reconstruct"]["error"] == ERROR


@pytest.mark.parametrize(
    ("dead_lettered", "expected"), [(False, "failed"), (True, "dead_lettered")]
)
def test_the_stage_a_job_failed_in_shows_the_error(dead_lettered: bool, expected: str) -> None:
    views = stage_views(
        ledger_until(PipelineStage.RECONSTRUCT),
        ctx(
            "reconstruct",
            "failed",
            attempts=2,
            completed_at_ms=T0 + 120_000,
            error=ERROR,
            dead_lettered=dead_lettered,
        ),
        rfc3339,
    )
    assert statuses(views) == ["succeeded", expected, "pending", "pending", "pending", "pending"]
    assert views["reconstruct"] == {
        "status": expected,
        "attempts": 2,
        "started_at": rfc3339(T0 + 100_000),
        "finished_at": rfc3339(T0 + 120_000),
        "error": ERROR,
    }


def test_publish_succeeds_with_the_completed_commit_and_cleanup_follows() -> None:
    ledger = ledger_until(PipelineStage.PUBLISH)
    completed = ctx("publish", "completed", completed_at_ms=T0 + 104_000)
    views = stage_views(ledger, completed, rfc3339)
    assert statuses(views) == ["succeeded"] * 5 + ["pending"]
    assert views["publish"]["started_at"] == rfc3339(T0 + 100_000)
    assert views["publish"]["finished_at"] == rfc3339(T0 + 104_000)
    ledger[PipelineStage.CLEANUP] = StageRecord(StageStatus.SUCCEEDED, 1, T0 + 105_000,
                                                T0 + 105_050)  # fmt: skip
    views = stage_views(ledger, completed, rfc3339)
    assert views["cleanup"]["status"] == "succeeded"
    assert views["cleanup"]["finished_at"] == rfc3339(T0 + 105_050)


def test_a_processing_job_is_not_succeeded_in_publish_and_canceled_ones_stay_pending() -> None:
    ledger = ledger_until(PipelineStage.PUBLISH)
    assert stage_views(ledger, ctx("publish", "processing"), rfc3339)["publish"]["status"] == (
        "running"
    )
    canceled = stage_views(ledger, ctx("publish", "canceled"), rfc3339)
    assert canceled["publish"]["status"] == "pending"
    assert canceled["publish"]["error"] is None


def test_a_current_stage_whose_record_succeeded_keeps_its_record() -> None:
    """The job may still name a stage whose success was recorded (a redrive from a later
    stage starts there): the record wins over the job's run."""
    ledger = ledger_until(PipelineStage.RENDER)
    views = stage_views(ledger, ctx("export", "failed", error=ERROR), rfc3339)
    assert views["export"]["status"] == "succeeded"
    assert views["export"]["error"] is None


# -- the job view, from job hashes ----------------------------------------------------------


def job_hash(**fields: str) -> dict[str, str]:
    base = {
        "id": "job_00006H2ZREWFRZ99JDC12Z65BYVF8",
        "tenant": "acme",
        "status": "queued",
        "quality": "preview",
        "stream": "interactive",
        "created_at_ms": str(T0 - 1_000),
        "attempts": "0",
        "deliveries": "0",
    }
    return {**base, **fields}


def ledger_fields(ledger: dict[PipelineStage, StageRecord]) -> dict[str, str]:
    return {LEDGER_PREFIX + s.value: r.to_json() for s, r in ledger.items()}


def test_the_job_view_of_a_job_never_staged() -> None:
    view = job_view(JobRecord.from_hash(job_hash()), "http://gw")
    assert view["current_stage"] is None
    assert view["stages"] == {}
    assert view["started_at"] is None


def test_the_job_view_of_a_staged_job_starts_with_its_first_stage() -> None:
    """A staged job's `started_at_ms` is its current stage's start; the view's `started_at`
    is the first stage's. A record a redrive cleared ('') reads as never run."""
    raw = job_hash(
        status="processing",
        attempts="1",
        stage="started",
        current_stage="render",
        started_at_ms=str(T0 + 100_000),
        **ledger_fields(ledger_until(PipelineStage.RENDER)),
        **{LEDGER_PREFIX + "render": ""},
    )
    job = JobRecord.from_hash(raw)
    assert set(ledger_of(raw)) == set(PIPELINE[:3])
    view = job_view(job, "http://gw")
    assert view["current_stage"] == "render"
    assert view["started_at"] == rfc3339(T0) == view["stages"]["ingest"]["started_at"]
    assert view["stages"]["render"]["started_at"] == rfc3339(T0 + 100_000)
    assert statuses(view["stages"]) == ["succeeded"] * 3 + ["running", "pending", "pending"]


@pytest.mark.parametrize(("stage", "expected"), [("failed", "failed"),
                                                 ("dead_lettered", "dead_lettered")])  # fmt: skip
def test_the_job_view_marks_a_dead_lettered_stage_from_the_jobs_stage(
    stage: str, expected: str
) -> None:
    """finish.lua and reclaim.lua write `stage` = dead_lettered when they dead-letter a job;
    the stage's error is the job view's own error object."""
    raw = job_hash(
        status="failed",
        attempts="5",
        stage=stage,
        current_stage="reconstruct",
        started_at_ms=str(T0 + 100_000),
        completed_at_ms=str(T0 + 101_000),
        error_code="dead_lettered",
        error_message="its worker died 5 times",
        error_retryable="0",
        **ledger_fields(ledger_until(PipelineStage.RECONSTRUCT)),
    )
    view = job_view(JobRecord.from_hash(raw), "http://gw")
    recon = view["stages"]["reconstruct"]
    assert recon["status"] == expected
    assert recon["attempts"] == 5
    assert recon["error"] == view["error"]
    assert recon["error"] == {
        "code": "dead_lettered", "message": "its worker died 5 times", "retryable": False,
    }  # fmt: skip
    assert recon["finished_at"] == view["completed_at"]
