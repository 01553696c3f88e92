"""The job as the API shows it (the contract's job object), built from a `JobRecord`.

Pure formatting; no I/O.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from splatq.shared.engine.jobs import JobRecord
from splatq.shared.engine.stages import (
    FIRST_STAGE,
    PipelineStage,
    StageContext,
    StageStatus,
    stage_views,
)
from splatq.shared.vendor.notes import upstream_view

# A Redis stream id of at most 19 digits a side: every id Redis makes (milliseconds and a
# sequence), always below its 64-bit limit; the OpenAPI document declares the same pattern.
STREAM_ID_PATTERN = "[0-9]{1,19}-[0-9]{1,19}"
_STREAM_ID_RE = re.compile(STREAM_ID_PATTERN)


def valid_stream_id(value: str) -> bool:
    """A Redis stream id (STREAM_ID_PATTERN): two ASCII integers Redis accepts."""
    return _STREAM_ID_RE.fullmatch(value) is not None


def rfc3339(ms: int | None) -> str | None:
    if not ms:
        return None
    return (
        datetime.fromtimestamp(ms / 1000, UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


def error_view(job: JobRecord) -> dict[str, Any] | None:
    """The job's error as the API shows it: only while the job is failed or retrying."""
    if job.error is None or job.status.value not in {"failed", "retrying"}:
        return None
    return {"code": job.error.code, "message": job.error.message, "retryable": job.error.retryable}


def started_at_ms(job: JobRecord) -> int | None:
    """When the job started. A staged job's `started_at_ms` is its current stage's start
    (each stage's start rewrites it): the job started when its first stage did, which the
    first stage's ledger record keeps once that stage has succeeded."""
    first = job.ledger.get(FIRST_STAGE)
    if first is not None and first.started_at_ms:
        return first.started_at_ms
    return job.started_at_ms


def stages_view(job: JobRecord, error: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """The contract's `stages` object (`{}` for a job no staged worker has run)."""
    ctx = StageContext(
        current_stage=job.current_stage,
        status=job.status.value,
        attempts=job.attempts,
        started_at_ms=job.started_at_ms,
        completed_at_ms=job.completed_at_ms,
        error=error,
        dead_lettered=job.stage == "dead_lettered",
    )
    return stage_views(job.ledger, ctx, rfc3339)


def foreground_of(job: JobRecord) -> str | None:
    """How the object was separated from its backdrop (alpha, segmented, learned): the
    completed job's record, or a staged job's ingest once it succeeded; None until known."""
    if job.foreground:
        return job.foreground
    record = job.ledger.get(PipelineStage.INGEST)
    if record is None or record.status is not StageStatus.SUCCEEDED:
        return None
    return record.facts.get("foreground") or None


def job_view(
    job: JobRecord, base_url: str, cached: bool = False, stale: bool = False
) -> dict[str, Any]:
    url = f"{base_url}/v1/jobs/{job.id}"
    error = error_view(job)
    return {
        "id": job.id,
        "status": job.status.value,
        "quality": job.quality,
        "stream": job.stream.value,
        "created_at": rfc3339(job.created_at_ms),
        "started_at": rfc3339(started_at_ms(job)),
        "completed_at": rfc3339(job.completed_at_ms),
        "attempts": job.attempts,
        # Times a worker took the job, and the worker deaths charged to it (1/k each when k
        # jobs shared the dying worker; the dead-letter limit applies to the charge).
        "deliveries": job.deliveries,
        "delivery_charge": round(job.delivery_charge, 2),
        "progress": round(job.progress, 4),
        "stage": job.stage,
        # The staged pipeline: the stage the job is in (null: never staged) and every stage.
        "current_stage": job.current_stage or None,
        "stages": stages_view(job, error),
        "cached": cached,
        # A cache answer past its soft TTL (a refresh runs in the background).
        "stale": stale,
        "model": job.model or None,
        "foreground": foreground_of(job),
        "compute_time_ms": job.compute_time_ms,
        "error": error,
        "artifacts": dict(job.artifacts) if job.artifacts and job.status == "completed" else None,
        "metadata": dict(job.metadata),
        # A hosted model's call (SPLATQ_MODEL=remote): vendor, its request id, the latency.
        "upstream": upstream_view(job.notes, job.quality),
        "urls": {"get": url, "cancel": f"{url}/cancel", "events": f"{url}/events"},
    }
