"""Events in the OpenAPI document: one payload schema per event (what webhooks deliver and the
SSE `data:` carries), the `webhooks` section, one SSE item (`JobStreamEvent`), the delivery
attempt record, and the example job they share.
"""

from __future__ import annotations

from typing import Any

from splatq.services.gateway.openapi_stages import (
    PREVIEW_READY_DESCRIPTION,
    PROGRESS_DESCRIPTION,
    PROGRESS_STAGE_MEMBERS,
)
from splatq.services.gateway.shape_schema import ref
from splatq.services.gateway.shapes import (
    JOB_EXAMPLE,
    DeliveryAttempt,
    DeliveryAttemptPage,
    schema,
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


# One delivery attempt, as the dispatcher records it, and a page of an endpoint's attempts.
ATTEMPT_SCHEMA: dict[str, Any] = schema(DeliveryAttempt)
ATTEMPT_PAGE: dict[str, Any] = schema(DeliveryAttemptPage)
