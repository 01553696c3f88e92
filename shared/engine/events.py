"""Job event names and the JSON fragments each event adds to the common payload.

Pure: Lua scripts splice these fragments into `{"event","id","timestamp","data":{job_id,
metadata, ...}}` in the same step as the state change (the outbox), so nothing here writes.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

import orjson

EVENT_NAMESPACE = "3d_reconstruction"


class EventType(StrEnum):
    QUEUED = f"{EVENT_NAMESPACE}.queued"
    STARTED = f"{EVENT_NAMESPACE}.started"
    PROGRESS = f"{EVENT_NAMESPACE}.progress"
    COMPLETED = f"{EVENT_NAMESPACE}.completed"
    FAILED = f"{EVENT_NAMESPACE}.failed"
    CANCELED = f"{EVENT_NAMESPACE}.canceled"
    # A full job's quick preview-resolution result is available (staged pipeline, opt-in).
    PREVIEW_READY = f"{EVENT_NAMESPACE}.preview_ready"


TERMINAL_EVENTS: frozenset[EventType] = frozenset(
    {EventType.COMPLETED, EventType.FAILED, EventType.CANCELED}
)


def _members(values: Mapping[str, object]) -> str:
    """`{"a":1,"b":2}` -> `"a":1,"b":2` (object members to splice into the data object)."""
    encoded = orjson.dumps(dict(values)).decode()
    return encoded[1:-1]


def queued_fields(quality: str, stream: str) -> str:
    return _members({"quality": quality, "stream": stream})


def progress_fields(progress: float, stage: str) -> str:
    return _members({"progress": round(progress, 4), "stage": stage})


def stage_fields(progress: float, stage: str, status: str, next_stage: str = "") -> str:
    """A `progress` event of the staged pipeline: the stage that reached `status` (and the
    one the job moves on to)."""
    body: dict[str, object] = {
        "progress": round(progress, 4),
        "stage": stage,
        "stage_status": status,
    }
    if next_stage:
        body["next_stage"] = next_stage
    return _members(body)


def completed_fields(model: str, compute_time_ms: int, artifacts: Mapping[str, str]) -> str:
    return _members(
        {"model": model, "compute_time_ms": compute_time_ms, "artifacts": dict(artifacts)}
    )


def preview_ready_fields(
    model: str, compute_time_ms: int, resolution: int, artifacts: Mapping[str, str]
) -> str:
    """A progressive full job's quick result: its artifacts' URLs (as in `completed`), the
    model, how long the quick result took (ms) and the input resolution it was made at."""
    return _members(
        {
            "model": model,
            "compute_time_ms": compute_time_ms,
            "resolution": resolution,
            "artifacts": dict(artifacts),
        }
    )


def failed_fields(code: str, message: str, retryable: bool) -> str:
    return _members({"error_code": code, "message": message, "retryable": retryable})
