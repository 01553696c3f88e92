"""The client's typed results: `Job` (with the engine's `JobError` and its pipeline stages,
`JobStage`), `JobPage`, `Event` and `ApiProblem`.

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
from splatq.shared.engine.stages import StageStatus
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
class JobStage:
    """One stage of a staged job (`Job.stages`): pending, running, succeeded, failed or
    dead_lettered, its attempts, its times and, when it failed (or waits for a retry), why."""

    name: str
    status: StageStatus
    attempts: int
    started_at: datetime | None
    finished_at: datetime | None
    error: JobError | None

    @classmethod
    def from_json(cls, name: str, doc: Mapping[str, Any]) -> JobStage:
        err = doc.get("error")
        return cls(
            name=name,
            status=StageStatus(doc["status"]),
            attempts=int(doc.get("attempts") or 0),
            started_at=_time(doc.get("started_at")),
            finished_at=_time(doc.get("finished_at")),
            error=_error(err) if isinstance(err, Mapping) else None,
        )


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
    # The staged pipeline: the stage the job is in (None: no staged worker has taken it) and
    # every stage by name, in pipeline order (empty for such a job, or an older gateway).
    current_stage: str | None = None
    stages: Mapping[str, JobStage] = field(default_factory=dict)

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
            error=_error(err) if isinstance(err, Mapping) else None,
            artifacts=dict(doc.get("artifacts") or {}),
            metadata=dict(doc.get("metadata") or {}),
            raw=doc,
            current_stage=_str_or_none(doc.get("current_stage")),
            stages=_stages(doc.get("stages")),
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


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _stages(value: object) -> dict[str, JobStage]:
    if not isinstance(value, Mapping):
        return {}
    return {
        str(name): JobStage.from_json(str(name), doc)
        for name, doc in value.items()
        if isinstance(doc, Mapping)
    }


def _time(value: object) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None
