"""The answer shapes of the tenant's account (GET /v1/usage), the admin API (tenants, API
keys, quotas, the result cache) and the operator endpoints the console reads (stats, dead
letters, scheduled tasks), as typed frozen dataclasses; the OpenAPI document's schemas are
derived from them (services/gateway/shape_schema.py). See shapes.py for the conventions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from splatq.services.gateway.shape_schema import Spec, absent, shape
from splatq.services.gateway.shapes import Count, Time, TimeOrNull
from splatq.services.gateway.shapes_requests import RunningCaps, Weight
from splatq.shared.tenants.periods import Period

Seconds = Annotated[float, Spec(minimum=0)]
SecondsOrNull = Annotated[float | None, Spec(minimum=0)]
StreamClass = Literal["interactive", "synthesis"]
DeadLetterKind = Literal["jobs", "webhooks"]

# -- usage, tenants and keys ------------------------------------------------------------------


@shape("Usage")
@dataclass(frozen=True, kw_only=True, slots=True)
class Usage:
    """As services/gateway/quota_gate.py `usage_view` renders it."""

    tenant: str
    period: Period
    period_id: str = absent()
    quota_gpu_seconds: Annotated[SecondsOrNull, Spec(description="null: no quota")]
    reserved_gpu_seconds: Annotated[
        Seconds, Spec(description="held by jobs not finished yet (estimates)")
    ]
    used_gpu_seconds: Annotated[Seconds, Spec(description="measured GPU time of completed jobs")]
    remaining_gpu_seconds: SecondsOrNull = absent()
    resets_at: Annotated[Time, Spec(description="start of the next period (UTC)")]


@shape("ApiKey")
@dataclass(frozen=True, kw_only=True, slots=True)
class ApiKey:
    key_id: Annotated[str, Spec(pattern="^key_[0-9A-Z]{26}$")]
    label: str
    hint: Annotated[str, Spec(description="prefix and last 4 characters")]
    created_at: Time
    expires_at: Annotated[TimeOrNull, Spec(description="set on a key retired by a rotation")]
    api_key: Annotated[str, Spec(description="only in the answer that creates it")] = absent()
    retired_key_id: str = absent()


@shape("Tenant")
@dataclass(frozen=True, kw_only=True, slots=True)
class Tenant:
    tenant: str
    created_at: TimeOrNull = absent()
    weight: Weight
    running_caps: RunningCaps
    quota: Usage
    keys: list[ApiKey]


@dataclass(frozen=True, kw_only=True, slots=True)
class TenantRow:
    tenant: str
    created_at: Annotated[TimeOrNull, Spec(description="null: only in SPLATQ_API_KEYS")]
    configured: Annotated[bool, Spec(description="named in SPLATQ_API_KEYS")]


@dataclass(frozen=True, kw_only=True, slots=True)
class TenantPage:
    """GET /v1/admin/tenants."""

    tenants: list[TenantRow]
    next_cursor: str | None
    next: Annotated[str | None, Spec(description="the next page's URL")]


@dataclass(frozen=True, kw_only=True, slots=True)
class KeyList:
    """GET /v1/admin/tenants/{tenant}/keys."""

    keys: list[ApiKey]


@shape("CacheInfo")
@dataclass(frozen=True, kw_only=True, slots=True)
class CacheInfo:
    version: Annotated[str, Spec(description="the model/backend version")]
    generation: Annotated[Count, Spec(description="purges of this version so far")]
    soft_ttl_s: Count
    hard_ttl_s: Annotated[int, Spec(minimum=1)]


# -- the operator view: stats -----------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class StreamRow:
    partition: int
    stage: str
    stream: StreamClass
    depth: Annotated[int, Spec(description="stream length (acknowledged entries too)")]
    queued: Annotated[int, Spec(description="in the tenants' fair queues")]
    ready: Annotated[int | None, Spec(description="in the stream, not handed out")]
    waiting: int | None = absent()
    running: Annotated[int, Spec(description="handed to a worker, not acknowledged")]
    consumers: int
    oldest_waiting_s: float | None
    delayed: Annotated[int, Spec(description="retries waiting for their due time")] = absent()


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerLease:
    partition: int = absent()
    stage: str = absent()
    stream: str = absent()
    leases: int = absent()
    idle_ms: int = absent()


@dataclass(frozen=True, kw_only=True, slots=True)
class Worker:
    name: str
    last_seen: TimeOrNull
    alive: Annotated[bool, Spec(description="its card is fresh (it keeps ticking)")]
    host: str | None = absent()
    pid: int | None = absent()
    started_at: TimeOrNull = absent()
    stages: list[str]
    slots: int
    in_use: int
    running: int
    leases: list[WorkerLease]


@dataclass(frozen=True, kw_only=True, slots=True)
class StageRate:
    stage: str = absent()
    succeeded: int = absent()
    per_minute: float = absent()


@dataclass(frozen=True, kw_only=True, slots=True)
class JobOutcomes:
    completed: int = absent()
    failed: int = absent()
    canceled: int = absent()


@dataclass(frozen=True, kw_only=True, slots=True)
class Throughput:
    window_s: int
    truncated: bool = absent()
    stages: list[StageRate]
    jobs: JobOutcomes


@dataclass(frozen=True, kw_only=True, slots=True)
class DeadLetterDepths:
    jobs: int = absent()
    webhooks: int = absent()


@shape("AdminStats")
@dataclass(frozen=True, kw_only=True, slots=True)
class AdminStats:
    """GET /v1/admin/stats (services/gateway/ops_stats.py)."""

    generated_at: Time
    partitions: int
    streams: list[StreamRow]
    throughput: Throughput
    workers: list[Worker]
    dead_letters: DeadLetterDepths


# -- the operator view: dead letters and scheduled tasks --------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class DeadLetterRow:
    id: Annotated[str, Spec(description="<partition>/<entry id>")]
    kind: DeadLetterKind
    reason: str
    at: TimeOrNull
    subject: Annotated[str | None, Spec(description="the job id or the webhook message id")]
    tenant: str | None
    redrives: int
    redrivable: bool
    status: str | None = absent()
    current_stage: str | None = absent()
    url: str | None = absent()
    event: str | None = absent()
    error: dict[str, Any] | None = absent()


@shape("DeadLetterPage")
@dataclass(frozen=True, kw_only=True, slots=True)
class DeadLetterPage:
    kind: str
    total: int
    items: list[DeadLetterRow]


@shape("DeadLetter")
@dataclass(frozen=True, kw_only=True, slots=True)
class DeadLetter:
    id: str
    kind: str
    reason: str
    job_id: str | None = absent()
    at: str
    fields: dict[str, str]
    attempts: Annotated[
        list[dict[str, Any]], Spec(description="a webhook message's delivery attempts")
    ] = absent()
    audit: list[dict[str, Any]]
    job: Annotated[
        dict[str, Any] | None,
        Spec(description="the dead job: status, error, stages and events (its death log)"),
    ]


@dataclass(frozen=True, kw_only=True, slots=True)
class Redriven:
    """POST .../redrive."""

    id: str
    outcome: Literal["redriven"]
    job_id: str | None = absent()


@dataclass(frozen=True, kw_only=True, slots=True)
class ScheduledTask:
    task: str
    schedule: str
    enabled: bool = absent()
    running: bool = absent()
    checkpoint: str | None = absent()
    last_success: TimeOrNull = absent()
    last_failure: TimeOrNull = absent()
    next_run: TimeOrNull = absent()
    history: list[dict[str, Any]] = absent()


@shape("ScheduledTasks")
@dataclass(frozen=True, kw_only=True, slots=True)
class ScheduledTasks:
    config: Annotated[str, Spec(description="the redriver configuration's source")]
    tasks: list[ScheduledTask]
