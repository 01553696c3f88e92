"""Events in the OpenAPI document: one payload schema per event (what webhooks deliver and the
SSE `data:` carries), the `webhooks` section, one SSE item (`JobStreamEvent`), the delivery
attempt record, and the example job they share.
"""

from __future__ import annotations

from typing import Any

from splatq.services.gateway.openapi_common import ref
from splatq.services.gateway.openapi_stages import (
    PREVIEW_READY_DESCRIPTION,
    PROGRESS_DESCRIPTION,
    PROGRESS_STAGE_MEMBERS,
)
from splatq.services.gateway.views import STREAM_ID_PATTERN
from splatq.shared.engine.events import TERMINAL_EVENTS, EventType
from splatq.shared.webhooks.store import TEST_EVENT

STREAM_ID = f"^{STREAM_ID_PATTERN}$"

# What each event adds to `data` (shared/engine/events.py builds the same fragments).
_EVENT_DATA: dict[str, dict[str, Any]] = {
    EventType.QUEUED.value: {"quality": ref("Quality"), "stream": {"type": "string"}},
    EventType.STARTED.value: {"attempt": {"type": "integer", "minimum": 1}},
    EventType.PROGRESS.value: {"progress": {"type": "number", "minimum": 0, "maximum": 1},
                               "stage": {"type": "string"}},
    EventType.PREVIEW_READY.value: {"model": {"type": "string"},
                                    "compute_time_ms": {"type": "integer"},
                                    "resolution": {"type": "integer", "minimum": 1},
                                    "artifacts": ref("ArtifactUrls")},
    EventType.COMPLETED.value: {"model": {"type": "string"},
                                "compute_time_ms": {"type": "integer"},
                                "artifacts": ref("ArtifactUrls")},
    EventType.FAILED.value: {"error_code": {"type": "string"}, "message": {"type": "string"},
                             "retryable": {"type": "boolean"}},
    EventType.CANCELED.value: {},
}  # fmt: skip
# Members an event may carry besides its required ones.
_EVENT_OPTIONAL: dict[str, dict[str, Any]] = {
    EventType.PROGRESS.value: {
        **PROGRESS_STAGE_MEMBERS,
        # a hosted model's call: when its prediction is created and when it ends
        "upstream": {
            "type": "object",
            "description": "a hosted model's call (as the job view's `upstream`, with the "
            "prediction's `status`)",
            "properties": {
                "vendor": {"type": "string"},
                "request_id": {"type": ["string", "null"]},
                "latency_ms": {"type": ["integer", "null"]},
                "prediction_id": {"type": ["string", "null"]},
                "status": {"type": ["string", "null"]},
            },
        },
    }
}
# What a receiver should know of an event, besides its payload schema.
_EVENT_NOTES: dict[str, str] = {
    EventType.PROGRESS.value: PROGRESS_DESCRIPTION,
    EventType.PREVIEW_READY.value: PREVIEW_READY_DESCRIPTION,
}


def schema_name(event: str) -> str:
    """`3d_reconstruction.completed` -> `CompletedEvent`, `webhook.test` -> `TestEvent`."""
    return event.rsplit(".", 1)[1].capitalize() + "Event"


# The job events (what SSE carries); TestEvent is delivered to endpoints only.
EVENT_SCHEMA_NAMES = [schema_name(e) for e in _EVENT_DATA]
_JOB_URL = "https://api.example.com/v1/jobs/job_00006H2ZREWFRZ99JDC12Z65BYVF8"
JOB_EXAMPLE: dict[str, Any] = {
    "id": "job_00006H2ZREWFRZ99JDC12Z65BYVF8", "status": "completed", "quality": "preview",
    "stream": "interactive", "created_at": "2026-12-01T09:30:00.120Z",
    "started_at": "2026-12-01T09:30:00.480Z", "completed_at": "2026-12-01T09:30:03.910Z",
    "attempts": 1, "deliveries": 1, "delivery_charge": 0.0, "progress": 1.0,
    "stage": "completed", "current_stage": "publish",
    "stages": {
        stage: {"status": "succeeded" if stage != "cleanup" else "pending",
                "attempts": 1 if stage != "cleanup" else 0,
                "started_at": start if stage != "cleanup" else None,
                "finished_at": end if stage != "cleanup" else None, "error": None}
        for stage, start, end in (
            ("ingest", "2026-12-01T09:30:00.480Z", "2026-12-01T09:30:00.610Z"),
            ("reconstruct", "2026-12-01T09:30:00.640Z", "2026-12-01T09:30:02.950Z"),
            ("export", "2026-12-01T09:30:02.990Z", "2026-12-01T09:30:03.240Z"),
            ("render", "2026-12-01T09:30:03.270Z", "2026-12-01T09:30:03.700Z"),
            ("publish", "2026-12-01T09:30:03.730Z", "2026-12-01T09:30:03.910Z"),
            ("cleanup", None, None),
        )
    },
    "cached": False, "stale": False, "model": "builtin", "foreground": "segmented",
    "compute_time_ms": 3430, "error": None,
    "artifacts": {name: f"{_JOB_URL}/artifacts/{name}"
                  for name in ("gaussian_ply", "splat", "rendered_preview", "mask")},
    "metadata": {"order": "A-1042"}, "upstream": None,
    "urls": {"get": _JOB_URL, "cancel": f"{_JOB_URL}/cancel", "events": f"{_JOB_URL}/events"},
}  # fmt: skip


def _event_schema(event: str, data: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["event", "id", "timestamp", "data"],
        "properties": {
            "event": {"const": event},
            "id": {"type": "string", "description": "evt_…, the webhook-id header"},
            "timestamp": {"type": "integer", "description": "Unix seconds"},
            "data": data,
        },
    }


def event_schemas() -> dict[str, Any]:
    """One payload schema per event, and `JobStreamEvent` (one SSE item)."""
    out: dict[str, Any] = {}
    for event, extra in _EVENT_DATA.items():
        out[schema_name(event)] = _event_schema(event, {
            "type": "object",
            "required": ["job_id", "metadata", *extra],
            "properties": {"job_id": {"type": "string"}, "metadata": {"type": "object"},
                           **extra, **_EVENT_OPTIONAL.get(event, {})},
        })  # fmt: skip
    out[schema_name(TEST_EVENT)] = _event_schema(TEST_EVENT, {
        "type": "object", "required": ["endpoint_id"],
        "properties": {"endpoint_id": {"type": "string"}, "message": {"type": "string"}},
    })  # fmt: skip
    out[schema_name(EventType.COMPLETED.value)]["examples"] = [{
        "event": EventType.COMPLETED.value, "id": "evt_06H2ZREWFVDJYKDAM8D9CVSYDR",
        "timestamp": 1764581403,
        "data": {"job_id": JOB_EXAMPLE["id"], "metadata": {"order": "A-1042"},
                 "model": "builtin", "compute_time_ms": 3430,
                 "artifacts": JOB_EXAMPLE["artifacts"]},
    }]  # fmt: skip
    # One Server-Sent Event as OpenAPI 3.2 models a `text/event-stream` item (`itemSchema`):
    # its `data` is the JSON payload webhooks deliver for the same event.
    out["JobStreamEvent"] = {
        "type": "object",
        "description": "One event of GET /v1/jobs/{job_id}/events.",
        "required": ["id", "event", "data"],
        "properties": {
            "id": {"type": "string", "pattern": STREAM_ID,
                   "description": "resume after it with Last-Event-ID"},
            "event": ref("EventName"),
            "data": {"type": "string", "contentMediaType": "application/json",
                     "contentSchema": {"oneOf": [ref(n) for n in EVENT_SCHEMA_NAMES]}},
        },
    }  # fmt: skip
    return out


def webhooks() -> dict[str, Any]:
    """The OpenAPI 3.1 `webhooks` section: what a receiver gets, per event."""
    signature = [
        {"name": "webhook-id", "in": "header", "required": True, "schema": {"type": "string"},
         "description": "the event id: the same on every retry (deduplicate on it)"},
        {"name": "webhook-timestamp", "in": "header", "required": True,
         "schema": {"type": "string"}, "description": "Unix seconds of this attempt"},
        {"name": "webhook-signature", "in": "header", "required": True,
         "schema": {"type": "string"},
         "description": "`v1,<base64 HMAC-SHA256>` (Standard Webhooks); two during a rotation"},
    ]  # fmt: skip
    out: dict[str, Any] = {}
    for event in [*_EVENT_DATA, TEST_EVENT]:
        terminal = event in TERMINAL_EVENTS
        out[event] = {
            "post": {
                "operationId": f"on_{event.replace('.', '_')}",
                "tags": ["Webhook events"],
                "summary": f"{event}" + (" (terminal: always sent)" if terminal else ""),
                "description": (f"{_EVENT_NOTES[event]} " if event in _EVENT_NOTES else "")
                + "Signed per Standard Webhooks with the endpoint's (or, for a "
                "job's webhook_url, the tenant's) secret; the same payload is the SSE "
                "`data:` of GET /v1/jobs/{id}/events. Answer 2xx within the timeout; other "
                "answers are retried with backoff, 410 disables an endpoint.",
                "parameters": signature,
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": ref(schema_name(event))}}},
                "responses": {"2XX": {"description": "received"},
                              "410": {"description": "stop sending (disables an endpoint)"}},
            }
        }  # fmt: skip
    return out


# One delivery attempt, as the dispatcher records it (services/webhook_dispatcher/
# dispatcher.py `_attempt_record`): GET /v1/jobs/{id}/deliveries and the endpoint attempt log.
ATTEMPT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["message_id", "event_id", "event", "target", "url", "attempt", "at",
                 "status_code", "latency_ms", "outcome"],
    "properties": {
        "message_id": {"type": "string", "description": "<event id>:<target>"},
        "event_id": {"type": "string", "description": "the webhook-id header"},
        "event": {"type": "string"},
        "target": {"type": "string", "description": "an endpoint id, or `job` (webhook_url)"},
        "url": {"type": "string"},
        "attempt": {"type": "integer", "minimum": 1},
        "at": {"type": "integer", "description": "Unix seconds"},
        "status_code": {"type": ["integer", "null"], "description": "null: no HTTP answer"},
        "latency_ms": {"type": "number", "minimum": 0},
        "outcome": {"type": "string", "enum": ["delivered", "retry", "failed", "dropped"]},
        "error": {"type": ["string", "null"]},
        "response": {"type": ["string", "null"], "description": "the answer's first bytes"},
        "probe": {"type": "boolean", "description": "sent as a half-open circuit's probe"},
    },
    "examples": [{
        "message_id": "evt_06H2ZREWFVDJYKDAM8D9CVSYDR:ep_06H2ZREXH1YX0PG5WMR2BWK280",
        "event_id": "evt_06H2ZREWFVDJYKDAM8D9CVSYDR", "event": "3d_reconstruction.completed",
        "target": "ep_06H2ZREXH1YX0PG5WMR2BWK280", "url": "https://hooks.example.com/splatq",
        "attempt": 1, "at": 1764581403, "status_code": 200, "latency_ms": 84.2,
        "outcome": "delivered", "error": None, "response": "ok",
    }],
}  # fmt: skip
ATTEMPT_PAGE: dict[str, Any] = {
    "type": "object",
    "required": ["endpoint_id", "items", "next_cursor", "next"],
    "properties": {
        "endpoint_id": {"type": "string"},
        "items": {"type": "array", "items": ref("DeliveryAttempt")},
        "next_cursor": {"type": ["string", "null"]},
        "next": {"type": ["string", "null"]},
    },
}
