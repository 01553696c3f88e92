"""The client's typed results: `Job` (with the engine's `JobError`), `JobPage`, `Event` and
`ApiProblem`.

Pure: built from the gateway's JSON; the raw document stays on `.raw` for fields this version
does not know yet.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from splatq.shared.engine.events import TERMINAL_EVENTS, EventType
from splatq.shared.engine.jobs import JobError  # the same {code, message, retryable}
from splatq.shared.engine.states import TERMINAL, JobStatus


class ApiProblem(Exception):
    """The gateway refused or failed a request (problem+json), or could not be reached
    (`status == 0`, code `unreachable`)."""

    def __init__(self, status: int, code: str, detail: str, retry_after: float | None = None):
        super().__init__(f"{status} {code}: {detail}")
        self.status = status
        self.code = code
        self.detail = detail
        self.retry_after = retry_after


@dataclass(frozen=True, slots=True)
class Job:
    """`GET /v1/jobs/{id}` as typed fields (the contract's job document)."""

    id: str
    status: JobStatus
    quality: str
    stream: str
    created_at: datetime | None
    started_at: datetime | None
    completed_at: datetime | None
    attempts: int
    progress: float
    stage: str
    cached: bool
    model: str | None
    compute_time_ms: int | None
    error: JobError | None
    artifacts: Mapping[str, str]
    metadata: Mapping[str, Any]
    raw: Mapping[str, Any] = field(repr=False, compare=False)

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Job:
        err = doc.get("error")
        return cls(
            id=str(doc["id"]),
            status=JobStatus(doc["status"]),
            quality=str(doc.get("quality", "")),
            stream=str(doc.get("stream", "")),
            created_at=_time(doc.get("created_at")),
            started_at=_time(doc.get("started_at")),
            completed_at=_time(doc.get("completed_at")),
            attempts=int(doc.get("attempts") or 0),
            progress=float(doc.get("progress") or 0.0),
            stage=str(doc.get("stage") or ""),
            cached=bool(doc.get("cached", False)),
            model=doc.get("model"),
            compute_time_ms=doc.get("compute_time_ms"),
            error=(
                JobError(
                    str(err.get("code", "")),
                    str(err.get("message", "")),
                    bool(err.get("retryable", False)),
                )
                if isinstance(err, Mapping)
                else None
            ),
            artifacts=dict(doc.get("artifacts") or {}),
            metadata=dict(doc.get("metadata") or {}),
            raw=doc,
        )


@dataclass(frozen=True, slots=True)
class JobPage:
    """One page of `GET /v1/jobs`: the jobs, newest first, and the cursor of the next page
    (None on the last one). A page filtered by status may be short, even empty, and still
    have a `next_cursor`: follow it (or use `iter_jobs`) until it is None."""

    items: tuple[Job, ...]
    next_cursor: str | None

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> JobPage:
        cursor = doc.get("next_cursor")
        return cls(
            items=tuple(Job.from_json(item) for item in doc.get("items") or ()),
            next_cursor=cursor if isinstance(cursor, str) and cursor else None,
        )


@dataclass(frozen=True, slots=True)
class Event:
    """One Server-Sent Event: `id`, `name` (an `EventType` value) and the webhook payload."""

    id: str
    name: str
    payload: Mapping[str, Any]

    @property
    def type(self) -> EventType | None:
        try:
            return EventType(self.name)
        except ValueError:  # an event a newer gateway added
            return None

    @property
    def data(self) -> Mapping[str, Any]:
        data = self.payload.get("data")
        return data if isinstance(data, Mapping) else {}

    @property
    def terminal(self) -> bool:
        return self.type in TERMINAL_EVENTS


def _error(err: Mapping[str, Any]) -> JobError:
    return JobError(
        str(err.get("code", "")), str(err.get("message", "")), bool(err.get("retryable", False))
    )


def _time(value: object) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None
