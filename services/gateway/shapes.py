"""The API's answer shapes, written once as typed frozen dataclasses: the job, its stages and
error, a page of jobs, the problem (every error answer), delivery attempts and webhook
endpoints. The OpenAPI document's schemas are derived from them (services/gateway/
shape_schema.py); the admin and console shapes are in shapes_admin.py, request bodies in
shapes_requests.py.

A field without a default is a member every answer carries (`required`); `absent()` marks
one that may be missing. Names and values come from the modules that define them (engine
states, stages and streams, storage's artifacts), so the document cannot drift from them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from splatq.services.gateway.shape_schema import Schema, Spec, absent, schema_of, shape
from splatq.shared.engine.events import EventType
from splatq.shared.engine.keys import StreamName
from splatq.shared.engine.stages import ALL_STAGES, PipelineStage, StageStatus
from splatq.shared.engine.states import JobStatus

# The named enums: one component each (a generated client gets one class per concept).
Quality = Literal["preview", "full"]
COMPONENT_NAMES: dict[Any, str] = {
    JobStatus: "JobStatus",
    Quality: "Quality",
    StreamName: "JobStream",
    PipelineStage: "PipelineStage",
    EventType: "EventName",
}

Time = Annotated[str, Spec(format="date-time")]
TimeOrNull = Annotated[str | None, Spec(format="date-time")]
Count = Annotated[int, Spec(minimum=0)]
Fraction = Annotated[float, Spec(minimum=0, maximum=1)]


def schema(tp: Any) -> Schema:
    """`tp`'s schema, with the named enums referenced."""
    return schema_of(tp, COMPONENT_NAMES)


# -- problems ---------------------------------------------------------------------------------

# The codes the gateway sends today. `Problem.code` is a string, not an enum: a client
# generated today must still read a problem whose code was added later.
PROBLEM_CODES = [
    "invalid_request", "unauthorized", "forbidden", "not_found", "method_not_allowed",
    "already_finished", "not_ready", "payload_too_large", "unsupported_media_type",
    "invalid_image", "image_too_large", "image_too_complex", "too_many_decodes",
    "idempotency_key_reused", "rate_limited", "tenant_backlog_full", "quota_exceeded",
    "too_many_fetches", "too_many_streams", "overloaded", "unavailable", "not_replicated",
    "internal_error", "http_error", "endpoint_limit_reached", "endpoint_disabled",
    "admin_disabled", "tenant_exists", "image_url_forbidden", "image_url_unreachable",
    "image_url_too_large", "too_many_auth_failures", "request_timeout", "not_redrivable",
    "invalid_signature",
]  # fmt: skip
_CODE = (
    "a stable machine-readable code; known values: "
    + ", ".join(f"`{c}`" for c in PROBLEM_CODES)
    + ". New codes may be added: treat an unknown one by its HTTP status."
)


@shape("Problem", description="RFC 9457 problem details; every error answer of the API is one.")
@dataclass(frozen=True, kw_only=True, slots=True)
class Problem:
    type_: str
    title: str
    status: int
    detail: str
    code: Annotated[str, Spec(description=_CODE, examples=["invalid_request", "quota_exceeded"])]
    resets_at: Annotated[Time, Spec(description="quota_exceeded: when the quota period resets")] = (
        absent()
    )


# -- jobs -------------------------------------------------------------------------------------


@shape("JobError")
@dataclass(frozen=True, kw_only=True, slots=True)
class JobError:
    code: str
    message: str
    retryable: bool


@shape(
    "ArtifactUrls",
    description="gaussian_ply, splat and rendered_preview always; spz and mask (the "
    "foreground mask stage 0 used, an 8-bit greyscale PNG of the upright photo, 255 = "
    "object) when the worker wrote them",
)
@dataclass(frozen=True, kw_only=True, slots=True)
class ArtifactUrls:
    """One URL per artifact the job has (storage's ARTIFACTS: a test keeps them equal)."""

    gaussian_ply: str = absent()
    splat: str = absent()
    rendered_preview: str = absent()
    spz: str = absent()
    mask: str = absent()


@shape(
    "JobStage",
    description="One stage of a staged job. `pending`: not reached (or never to run: a "
    "canceled or failed job's later stages); `running`: the job is in this stage, being "
    "processed or waiting for its retry (then `error` is the failed attempt's); `succeeded`; "
    "`failed` or `dead_lettered`: the job failed in this stage (`error` says why).",
)
@dataclass(frozen=True, kw_only=True, slots=True)
class JobStage:
    """As services/gateway/views.py `stages_view` renders a stage."""

    status: StageStatus
    attempts: Count
    started_at: TimeOrNull
    finished_at: TimeOrNull
    error: Annotated[JobError | None, Spec(description="the failed attempt's error, or null")]


@shape(
    "Upstream",
    nullable=True,
    description="A hosted model's call (SPLATQ_MODEL=remote); null for a local model.",
)
@dataclass(frozen=True, kw_only=True, slots=True)
class Upstream:
    vendor: str
    request_id: Annotated[
        str | None, Spec(description="the vendor's request id (else its prediction id)")
    ]
    latency_ms: Annotated[
        int | None, Spec(description="upstream latency: the prediction's creation to its end")
    ]
    prediction_id: str | None = absent()


@dataclass(frozen=True, kw_only=True, slots=True)
class JobUrls:
    get: str
    cancel: str
    events: str


_STAGES = (
    "every pipeline stage by name, in pipeline order: "
    + ", ".join(s.value for s in ALL_STAGES)
    + " (cleanup runs after a completed or canceled job ended); `{}` for a job no "
    "staged worker has taken (yet)"
)
_FOREGROUND = (
    "how the object was separated from its backdrop: the input's own transparency (alpha), "
    "the built-in segmentation (segmented) or an installed learned remover (learned); null "
    "until known, and for a worker run with SPLATQ_FOREGROUND=none. The mask itself is the "
    "`mask` artifact"
)
_JOB_URL = "https://api.example.com/v1/jobs/job_00006H2ZREWFRZ99JDC12Z65BYVF8"
_STAGE_TIMES = (
    ("ingest", "2026-12-01T09:30:00.480Z", "2026-12-01T09:30:00.610Z"),
    ("reconstruct", "2026-12-01T09:30:00.640Z", "2026-12-01T09:30:02.950Z"),
    ("export", "2026-12-01T09:30:02.990Z", "2026-12-01T09:30:03.240Z"),
    ("render", "2026-12-01T09:30:03.270Z", "2026-12-01T09:30:03.700Z"),
    ("publish", "2026-12-01T09:30:03.730Z", "2026-12-01T09:30:03.910Z"),
)
JOB_EXAMPLE: dict[str, Any] = {
    "id": "job_00006H2ZREWFRZ99JDC12Z65BYVF8", "status": "completed", "quality": "preview",
    "stream": "interactive", "created_at": "2026-12-01T09:30:00.120Z",
    "started_at": "2026-12-01T09:30:00.480Z", "completed_at": "2026-12-01T09:30:03.910Z",
    "attempts": 1, "deliveries": 1, "delivery_charge": 0.0, "progress": 1.0,
    "stage": "completed", "current_stage": "publish",
    "stages": {
        **{stage: {"status": "succeeded", "attempts": 1, "started_at": start,
                   "finished_at": end, "error": None} for stage, start, end in _STAGE_TIMES},
        "cleanup": {"status": "pending", "attempts": 0, "started_at": None,
                    "finished_at": None, "error": None},
    },
    "cached": False, "stale": False, "model": "builtin", "foreground": "segmented",
    "compute_time_ms": 3430, "error": None,
    "artifacts": {name: f"{_JOB_URL}/artifacts/{name}"
                  for name in ("gaussian_ply", "splat", "rendered_preview", "mask")},
    "metadata": {"order": "A-1042"}, "upstream": None,
    "urls": {"get": _JOB_URL, "cancel": f"{_JOB_URL}/cancel", "events": f"{_JOB_URL}/events"},
}  # fmt: skip


@shape("Job", examples=(JOB_EXAMPLE,))
@dataclass(frozen=True, kw_only=True, slots=True)
class Job:
    """The job as services/gateway/views.py `job_view` renders it."""

    id: Annotated[str, Spec(pattern="^job_[0-9]{3}[0-9A-Z]{26}$")]
    status: JobStatus
    quality: Quality
    stream: StreamName
    created_at: Time
    started_at: TimeOrNull = absent()
    completed_at: TimeOrNull = absent()
    attempts: Count
    deliveries: Annotated[
        Count, Spec(description="times a worker took the job (released ones not counted)")
    ] = absent()
    delivery_charge: Annotated[
        float,
        Spec(minimum=0, description="worker deaths charged to the job: 1/k each when k jobs "
             "shared the dying worker; SPLATQ_MAX_DELIVERIES applies to it"),
    ] = absent()  # fmt: skip
    progress: Fraction
    stage: str = absent()
    current_stage: Annotated[
        PipelineStage | None,
        Spec(description="the pipeline stage the job is in (or ended in); null for a job no "
             "staged worker has taken (yet)"),
    ]  # fmt: skip
    stages: Annotated[dict[PipelineStage, JobStage], Spec(description=_STAGES)]
    cached: bool
    stale: Annotated[
        bool,
        Spec(description="a cache answer past its soft TTL (SPLATQ_CACHE_SOFT_TTL_S); one "
             "refresh runs in the background"),
    ] = absent()  # fmt: skip
    model: str | None = absent()
    foreground: Annotated[
        Literal["alpha", "segmented", "learned"] | None, Spec(description=_FOREGROUND)
    ] = absent()
    compute_time_ms: int | None = absent()
    error: JobError | None
    artifacts: ArtifactUrls | None
    metadata: dict[str, Any]
    upstream: Upstream | None = absent()
    urls: JobUrls


@shape("JobPage")
@dataclass(frozen=True, kw_only=True, slots=True)
class JobPage:
    items: list[Job]
    next_cursor: str | None
    next: Annotated[str | None, Spec(description="the next page's URL")]


# -- delivery attempts ------------------------------------------------------------------------

_ATTEMPT_EXAMPLE = {
    "message_id": "evt_06H2ZREWFVDJYKDAM8D9CVSYDR:ep_06H2ZREXH1YX0PG5WMR2BWK280",
    "event_id": "evt_06H2ZREWFVDJYKDAM8D9CVSYDR", "event": "3d_reconstruction.completed",
    "target": "ep_06H2ZREXH1YX0PG5WMR2BWK280", "url": "https://hooks.example.com/splatq",
    "attempt": 1, "at": 1764581403, "status_code": 200, "latency_ms": 84.2,
    "outcome": "delivered", "error": None, "response": "ok",
}  # fmt: skip


@shape("DeliveryAttempt", examples=(_ATTEMPT_EXAMPLE,))
@dataclass(frozen=True, kw_only=True, slots=True)
class DeliveryAttempt:
    """One delivery attempt, as the dispatcher records it (services/webhook_dispatcher/
    dispatcher.py `_attempt_record`): GET /v1/jobs/{id}/deliveries and an endpoint's log."""

    message_id: Annotated[str, Spec(description="<event id>:<target>")]
    event_id: Annotated[str, Spec(description="the webhook-id header")]
    event: str
    target: Annotated[str, Spec(description="an endpoint id, or `job` (webhook_url)")]
    url: str
    attempt: Annotated[int, Spec(minimum=1)]
    at: Annotated[int, Spec(description="Unix seconds")]
    status_code: Annotated[int | None, Spec(description="null: no HTTP answer")]
    latency_ms: Annotated[float, Spec(minimum=0)]
    outcome: Literal["delivered", "retry", "failed", "dropped"]
    error: str | None = absent()
    response: Annotated[str | None, Spec(description="the answer's first bytes")] = absent()
    probe: Annotated[bool, Spec(description="sent as a half-open circuit's probe")] = absent()


@shape("DeliveryAttemptPage")
@dataclass(frozen=True, kw_only=True, slots=True)
class DeliveryAttemptPage:
    endpoint_id: str
    items: list[DeliveryAttempt]
    next_cursor: str | None
    next: str | None


@dataclass(frozen=True, kw_only=True, slots=True)
class JobDeliveries:
    """GET /v1/jobs/{job_id}/deliveries."""

    job_id: str
    deliveries: list[DeliveryAttempt]


# -- webhook endpoints ------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class EndpointHealth:
    circuit: Literal["closed", "open", "half_open"]
    open_until: TimeOrNull = absent()
    consecutive_failures: Count
    failing_since: TimeOrNull = absent()
    last_success_at: TimeOrNull = absent()
    last_failure_at: TimeOrNull = absent()


@dataclass(frozen=True, kw_only=True, slots=True)
class EndpointUrls:
    self_: str = absent()


Secret = Annotated[str, Spec(pattern="^whsec_")]


@shape("WebhookEndpoint")
@dataclass(frozen=True, kw_only=True, slots=True)
class WebhookEndpoint:
    """As services/gateway/endpoints.py `endpoint_view` renders an endpoint."""

    id: Annotated[str, Spec(pattern="^ep_[0-9A-Z]{26}$")]
    url: str
    events: Annotated[
        list[str], Spec(description="subscribed event types; empty means every event")
    ]
    enabled: bool
    created_at: Time
    disabled_at: TimeOrNull = absent()
    disabled_reason: str | None = absent()
    health: EndpointHealth
    headers: Annotated[
        dict[str, str], Spec(description="custom headers sent with every delivery")
    ] = absent()
    previous_secret_expires_at: TimeOrNull = absent()
    secret: Annotated[Secret, Spec(description="only when created and after a rotation")] = absent()
    urls: EndpointUrls


@dataclass(frozen=True, kw_only=True, slots=True)
class EndpointList:
    """GET /v1/webhook-endpoints."""

    data: list[WebhookEndpoint]


@dataclass(frozen=True, kw_only=True, slots=True)
class TenantSecret:
    """GET /v1/webhook-secret and POST /v1/webhook-secret/rotate."""

    secret: Secret
    scheme: str = absent()
    previous_secret_expires_at: TimeOrNull


@dataclass(frozen=True, kw_only=True, slots=True)
class Recovered:
    """POST /v1/webhook-endpoints/{endpoint_id}/recover."""

    endpoint_id: str = absent()
    since: str = absent()
    recovered: Count
    expired: Count
    truncated: bool
    limit: int = absent()


@dataclass(frozen=True, kw_only=True, slots=True)
class SentTestEvent:
    """POST /v1/webhook-endpoints/{endpoint_id}/test (shared/webhooks/store.py TEST_EVENT)."""

    endpoint_id: str
    event: Literal["webhook.test"]
    event_id: str
    attempts_url: str = absent()
