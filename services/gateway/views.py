"""The job as the API shows it (the contract's job object), built from a `JobRecord`.

Pure formatting; no I/O.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from splatq.shared.engine.jobs import JobRecord

_STREAM_ID_RE = re.compile(r"[0-9]{1,20}-[0-9]{1,20}")
_U64_MAX = 2**64 - 1


def valid_stream_id(value: str) -> bool:
    """A Redis stream id Redis itself accepts: two ASCII unsigned 64-bit integers."""
    if not _STREAM_ID_RE.fullmatch(value):
        return False
    ms, _, seq = value.partition("-")
    return int(ms) <= _U64_MAX and int(seq) <= _U64_MAX


def rfc3339(ms: int | None) -> str | None:
    if not ms:
        return None
    return (
        datetime.fromtimestamp(ms / 1000, UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


def job_view(job: JobRecord, base_url: str, cached: bool = False) -> dict[str, Any]:
    url = f"{base_url}/v1/jobs/{job.id}"
    return {
        "id": job.id,
        "status": job.status.value,
        "quality": job.quality,
        "stream": job.stream.value,
        "created_at": rfc3339(job.created_at_ms),
        "started_at": rfc3339(job.started_at_ms),
        "completed_at": rfc3339(job.completed_at_ms),
        "attempts": job.attempts,
        # Times a worker took the job, and the worker deaths charged to it (1/k each when k
        # jobs shared the dying worker; the dead-letter limit applies to the charge).
        "deliveries": job.deliveries,
        "delivery_charge": round(job.delivery_charge, 2),
        "progress": round(job.progress, 4),
        "stage": job.stage,
        "cached": cached,
        "model": job.model or None,
        "compute_time_ms": job.compute_time_ms,
        "error": (
            {"code": job.error.code, "message": job.error.message, "retryable": job.error.retryable}
            if job.error and job.status.value in {"failed", "retrying"}
            else None
        ),
        "artifacts": dict(job.artifacts) if job.artifacts and job.status == "completed" else None,
        "metadata": dict(job.metadata),
        "urls": {"get": url, "cancel": f"{url}/cancel", "events": f"{url}/events"},
    }
