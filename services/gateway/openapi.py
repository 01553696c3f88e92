"""The OpenAPI 3.1 description of the gateway's HTTP API (hand-written, served at
/openapi.json and rendered at /docs); tests check that every route is described, that every
operation has a summary and a tag, that the request schemas name exactly the fields the
parsers accept, and a schemathesis run checks the whole of it against a running gateway.

Limits and names come from the modules that enforce them (submission, listing, headers,
waiting), so the document and the validation cannot drift apart on those.
"""

from __future__ import annotations

from typing import Any

from splatq.services.gateway import listing
from splatq.services.gateway.openapi_console import OPERATIONS as CONSOLE_OPERATIONS
from splatq.services.gateway.openapi_console import SCHEMAS as CONSOLE_SCHEMAS
from splatq.services.gateway.openapi_console import TAG as CONSOLE_TAG
from splatq.services.gateway.openapi_console import console_paths
from splatq.services.gateway.openapi_stages import (
    JOB_ERROR,
    JOB_PROPERTIES,
    JOB_STAGE,
    PREVIEW_READY_DESCRIPTION,
    PROGRESS_DESCRIPTION,
    PROGRESS_STAGE_MEMBERS,
    PROGRESSIVE_DESCRIPTION,
    QUICK_VARIANT_DESCRIPTION,
)
from splatq.services.gateway.openapi_tenants import SCHEMAS as TENANT_SCHEMAS
from splatq.services.gateway.openapi_tenants import tenant_paths
from splatq.services.gateway.submission import MAX_IDEMPOTENCY_KEY, MAX_METADATA_BYTES, QUALITIES
from splatq.shared import __version__
from splatq.shared.engine.events import TERMINAL_EVENTS, EventType
from splatq.shared.engine.states import JobStatus
from splatq.shared.storage.store import QUICK_VARIANT
from splatq.shared.webhooks import headers as custom_headers
from splatq.shared.webhooks.store import TEST_EVENT

_PROBLEM_CODES = [
    "invalid_request", "unauthorized", "not_found", "method_not_allowed", "already_finished",
    "not_ready", "payload_too_large", "unsupported_media_type", "invalid_image",
    "image_too_complex", "too_many_decodes",
    "image_too_large", "idempotency_key_reused", "rate_limited", "tenant_backlog_full",
    "overloaded",
    "internal_error", "endpoint_limit_reached", "endpoint_disabled", "too_many_streams",
    "unavailable", "not_replicated", "quota_exceeded", "forbidden", "admin_disabled",
    "tenant_exists", "image_url_forbidden", "image_url_unreachable",
    "image_url_too_large", "too_many_fetches", "not_redrivable",
]  # fmt: skip
JOB_STATUSES = [s.value for s in JobStatus]
TAGS = [
    {"name": "Jobs", "description": "Submit, list, read and cancel jobs; fetch artifacts."},
    {"name": "Events", "description": "Follow a job: Server-Sent Events and delivery logs."},
    {"name": "Webhook endpoints",
     "description": "Registered receivers of the tenant's events, their secrets and logs."},
    {"name": "Webhook secret", "description": "The tenant's secret for per-job webhook_urls."},
    {"name": "Usage", "description": "The caller's GPU quota and usage."},
    {"name": "Admin", "description": "Tenants, API keys and quotas; stats, dead letters and "
     "scheduled tasks (the admin key only)."},
    {"name": "Operations", "description": "Health, readiness, metrics and this document."},
    CONSOLE_TAG,
]  # fmt: skip
# Every operation's tag and summary, by operationId (a test checks none is missing).
OPERATIONS: dict[str, tuple[str, str]] = {
    "submitJob": ("Jobs", "Submit an image (or an image URL) for reconstruction"),
    "listJobs": ("Jobs", "List your jobs, newest first"),
    "getJob": ("Jobs", "Get a job"),
    "cancelJob": ("Jobs", "Cancel a job"),
    "getArtifact": ("Jobs", "Download an artifact of a completed job"),
    "jobEvents": ("Events", "Stream a job's events (Server-Sent Events)"),
    "jobDeliveries": ("Events", "List a job's webhook delivery attempts"),
    "webhookSecret": ("Webhook secret", "Get the tenant's webhook signing secret"),
    "rotateWebhookSecret": ("Webhook secret", "Rotate the tenant's webhook signing secret"),
    "createWebhookEndpoint": ("Webhook endpoints", "Register a webhook endpoint"),
    "listWebhookEndpoints": ("Webhook endpoints", "List webhook endpoints"),
    "getWebhookEndpoint": ("Webhook endpoints", "Get a webhook endpoint and its health"),
    "updateWebhookEndpoint": ("Webhook endpoints", "Change a webhook endpoint"),
    "deleteWebhookEndpoint": ("Webhook endpoints", "Delete a webhook endpoint"),
    "rotateWebhookEndpointSecret": ("Webhook endpoints", "Rotate an endpoint's secret"),
    "recoverWebhookEndpoint": ("Webhook endpoints", "Re-send an endpoint's failed messages"),
    "testWebhookEndpoint": ("Webhook endpoints", "Send a test event to an endpoint"),
    "listWebhookEndpointAttempts": ("Webhook endpoints", "List an endpoint's attempts"),
    "getUsage": ("Usage", "Get your GPU quota and usage"),
    "adminCreateTenant": ("Admin", "Create a tenant"),
    "adminListTenants": ("Admin", "List tenants"),
    "adminShowTenant": ("Admin", "Get a tenant with its quota, usage and keys"),
    "adminUpdateTenant": ("Admin", "Change a tenant's weight or running caps"),
    "adminAddKey": ("Admin", "Create (or rotate) an API key"),
    "adminListKeys": ("Admin", "List a tenant's API keys"),
    "adminRevokeKey": ("Admin", "Revoke an API key"),
    "adminGetQuota": ("Admin", "Get a tenant's quota and usage"),
    "adminSetQuota": ("Admin", "Set a tenant's quota"),
    "healthz": ("Operations", "Liveness"),
    "readyz": ("Operations", "Readiness (Redis reachable)"),
    "metrics": ("Operations", "Prometheus metrics"),
    "openapi": ("Operations", "This OpenAPI document"),
    "docs": ("Operations", "The API reference as a web page"),
    **CONSOLE_OPERATIONS,
}


def _problem(description: str, headers: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "description": description,
        "content": {
            "application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}
        },
    }
    if headers:
        out["headers"] = headers
    return out


_RETRY_AFTER = {"Retry-After": {"schema": {"type": "string"}, "description": "seconds"}}
_JOB_ID = {
    "name": "job_id", "in": "path", "required": True,
    "schema": {"type": "string", "maxLength": 64},
}  # fmt: skip
_EVENT_ID = {"type": "string", "pattern": "^[0-9]{1,20}-[0-9]{1,20}$"}  # else 400
_JOB = {"application/json": {"schema": {"$ref": "#/components/schemas/Job"}}}
_UNAVAILABLE = _problem("unavailable: Redis or storage unreachable; retry later", _RETRY_AFTER)
_COMMON = {
    "401": _problem("missing or unknown API key"),
    "404": _problem("no such job (or another tenant's)"),
    "503": _UNAVAILABLE,
}


def _secret_responses(description: str) -> dict[str, Any]:
    """The answers of GET /v1/webhook-secret and POST /v1/webhook-secret/rotate."""
    schema = {
        "type": "object",
        "required": ["secret", "previous_secret_expires_at"],
        "properties": {
            "secret": {"type": "string", "pattern": "^whsec_"},
            "scheme": {"type": "string"},
            "previous_secret_expires_at": {"type": ["string", "null"], "format": "date-time"},
        },
    }
    return {
        "200": {"description": description, "content": {"application/json": {"schema": schema}}},
        "401": _problem("missing or unknown API key"),
        "503": _UNAVAILABLE,
    }


def openapi_document(server_url: str, max_wait_s: int = 60) -> dict[str, Any]:
    """The document; `max_wait_s` is the gateway's bound on `Prefer: wait`."""
    doc = _document(server_url, max_wait_s)
    for path_item in doc["paths"].values():
        for operation in path_item.values():
            tag, summary = OPERATIONS[operation["operationId"]]
            operation.setdefault("tags", [tag])
            operation.setdefault("summary", summary)
    return doc


def _document(server_url: str, max_wait_s: int) -> dict[str, Any]:
    event_names = [e.value for e in EventType]
    params_props: dict[str, Any] = {
        "quality": {"type": "string", "enum": list(QUALITIES), "default": "full"},
        "webhook_url": {"type": "string", "format": "uri", "maxLength": 2048},
        "webhook_events": {"type": "array", "items": {"type": "string", "enum": event_names}},
        "metadata": {"type": "object",
                     "description": f"at most {MAX_METADATA_BYTES} bytes as JSON"},
        "cache": {"type": "boolean", "default": True},
        "progressive": {"type": "boolean", "default": False,
                        "description": PROGRESSIVE_DESCRIPTION},
    }  # fmt: skip
    image_url = {
        "type": "string",
        "format": "uri",
        "maxLength": 2048,
        "description": "http(s) URL of the image, fetched through the SSRF guard (in place of "
        "`image`; 422 image_url_forbidden, image_url_unreachable, image_url_too_large)",
    }
    return {
        "openapi": "3.1.0",
        "tags": TAGS,
        "webhooks": _webhooks(),
        "info": {
            "title": "splatq",
            "version": __version__,  # the package's version; the API itself is /v1
            "description": "Asynchronous image → 3D Gaussian Splatting jobs. Submit an image, "
            "get a job id at once (202), follow it by polling, Server-Sent Events or webhooks. "
            "Retention: a finished job's record (and its listing entry) is kept for the "
            "deployment's SPLATQ_JOB_RETENTION_S (7 days by default), its artifacts for "
            "SPLATQ_ARTIFACT_RETENTION_S (30 days by default).",
        },
        "servers": [{"url": server_url}],
        "security": [{"bearer": []}],
        "paths": {
            "/v1/jobs": {
                "post": {
                    "operationId": "submitJob",
                    "parameters": [
                        {
                            "name": "Prefer",
                            "in": "header",
                            "required": False,
                            "schema": {"type": "string", "maxLength": 64},
                            "description": f"`wait=N` (RFC 7240, as Replicate): answer 200 "
                            f"with the job if it ends within N seconds (at most {max_wait_s}; "
                            "`wait` alone waits that long), else the usual 202; "
                            "`Preference-Applied` says so",
                            "examples": {"wait": {"value": "wait=30"}},
                        },
                        {
                            "name": "Idempotency-Key",
                            "in": "header",
                            "required": False,
                            "schema": {
                                "type": "string",
                                "minLength": 1,
                                "maxLength": MAX_IDEMPOTENCY_KEY,
                                "pattern": "^[\\x21-\\x7e]+$",
                            },
                            "description": "visible ASCII, no spaces (else 400 invalid_request); "
                            "same key + same request -> same job for 24 h; "
                            "same key + different request -> 422 idempotency_key_reused",
                        },
                    ],
                    "requestBody": {
                        "required": True,
                        "content": {
                            "multipart/form-data": {
                                "schema": {
                                    "type": "object",
                                    "oneOf": [{"required": ["image"]}, {"required": ["image_url"]}],
                                    "properties": {
                                        "image": {"type": "string", "format": "binary"},
                                        "image_url": image_url,
                                        "params": {
                                            "type": "string",
                                            "description": "JSON object with the params",
                                        },
                                    },
                                }
                            },
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "oneOf": [{"required": ["image"]}, {"required": ["image_url"]}],
                                    "additionalProperties": False,
                                    "properties": {
                                        "image": {
                                            "type": "string",
                                            "description": "base64 or a data: URL",
                                        },
                                        "image_url": image_url,
                                        **params_props,
                                    },
                                },
                                "examples": {
                                    "image_url": {
                                        "summary": "input by URL",
                                        "value": {
                                            "image_url": "https://images.example.com/chair.png",
                                            "quality": "preview",
                                            "metadata": {"order": "A-1042"},
                                        },
                                    },
                                    "base64": {
                                        "summary": "inline image",
                                        "value": {
                                            "image": "data:image/png;base64,iVBORw0KGgo…",
                                            "webhook_url": "https://hooks.example.com/splatq",
                                            "webhook_events": ["3d_reconstruction.completed"],
                                        },
                                    },
                                },
                            },
                        },
                    },
                    "responses": {
                        "202": {
                            "description": "accepted (queued, or joined an identical "
                            "in-flight job)",
                            "content": _JOB,
                            "headers": {
                                "Location": {"schema": {"type": "string"}},
                                "Preference-Applied": {
                                    "schema": {"type": "string"},
                                    "description": "wait=N: the job did not end within it",
                                },
                            },
                        },
                        "200": {
                            "description": "an identical completed job (cached: true), "
                            "a repeat of a completed keyed request, or (`Prefer: wait`) a job "
                            "that ended within the wait",
                            "content": _JOB,
                            "headers": {
                                "Location": {"schema": {"type": "string"}},
                                "Preference-Applied": {"schema": {"type": "string"}},
                            },
                        },
                        "400": _problem("invalid_request: bad JSON, unknown or invalid param"),
                        "401": _problem("unauthorized"),
                        "413": _problem("payload_too_large"),
                        "415": _problem("unsupported_media_type"),
                        "422": _problem(
                            "invalid_image, image_too_large, image_too_complex, "
                            "idempotency_key_reused, image_url_forbidden, "
                            "image_url_unreachable or image_url_too_large"
                        ),
                        "429": _problem(
                            "rate_limited, too_many_decodes (the API key already has "
                            "SPLATQ_DECODE_CONCURRENCY_PER_TENANT uploads being decoded), "
                            "too_many_fetches (as many image_url fetches in flight), or "
                            "quota_exceeded (the tenant's GPU quota cannot hold the job's "
                            "estimate; Retry-After and `resets_at` say when the period resets)",
                            _RETRY_AFTER,
                        ),
                        "503": _problem(
                            "overloaded (the queue is full) or unavailable (Redis or storage "
                            "unreachable)",
                            _RETRY_AFTER,
                        ),
                    },
                },
                "get": {
                    "operationId": "listJobs",
                    "description": "The caller's jobs, newest first. A status filter is "
                    "applied to the records read, so a page may come back short (even "
                    "empty) with a next_cursor: follow it until it is null.",
                    "parameters": [
                        {
                            "name": "status",
                            "in": "query",
                            "required": False,
                            "schema": {"type": "string", "enum": JOB_STATUSES},
                            "description": "one status; repeat the parameter (or separate "
                            "with commas) for several",
                        },
                        {
                            "name": "created_since",
                            "in": "query",
                            "required": False,
                            "schema": {"type": "string", "format": "date-time"},
                            "description": "created at or after (RFC 3339 with a zone)",
                        },
                        {
                            "name": "created_until",
                            "in": "query",
                            "required": False,
                            "schema": {"type": "string", "format": "date-time"},
                            "description": "created before (RFC 3339 with a zone)",
                        },
                        {
                            "name": "limit",
                            "in": "query",
                            "required": False,
                            "schema": {
                                "type": "integer",
                                "minimum": 1,
                                "maximum": listing.MAX_LIMIT,
                                "default": listing.DEFAULT_LIMIT,
                            },
                        },
                        {
                            "name": "cursor",
                            "in": "query",
                            "required": False,
                            "schema": {"type": "string", "maxLength": 512},
                            "description": "the previous page's next_cursor, with the same filters",
                        },
                    ],
                    "responses": {
                        "200": {
                            "description": "a page of jobs",
                            "content": {
                                "application/json": {
                                    "schema": {"$ref": "#/components/schemas/JobPage"}
                                }
                            },
                            "headers": {
                                "Link": {
                                    "schema": {"type": "string"},
                                    "description": '<next>; rel="next"',
                                }
                            },
                        },
                        "400": _problem("invalid_request: bad status, time, limit or cursor"),
                        "401": _problem("missing or unknown API key"),
                        "503": _UNAVAILABLE,
                    },
                },
            },
            "/v1/jobs/{job_id}": {
                "get": {
                    "operationId": "getJob",
                    "parameters": [_JOB_ID],
                    "responses": {"200": {"description": "the job", "content": _JOB}, **_COMMON},
                }
            },
            "/v1/jobs/{job_id}/cancel": {
                "post": {
                    "operationId": "cancelJob",
                    "parameters": [_JOB_ID],
                    "responses": {
                        "202": {
                            "description": "canceled, or processing until the worker stops",
                            "content": _JOB,
                        },
                        "409": _problem("already_finished"),
                        **_COMMON,
                    },
                }
            },
            "/v1/jobs/{job_id}/artifacts/{name}": {
                "get": {
                    "operationId": "getArtifact",
                    "parameters": [
                        _JOB_ID,
                        {
                            "name": "name",
                            "in": "path",
                            "required": True,
                            "schema": {
                                "type": "string",
                                "enum": ["gaussian_ply", "splat", "rendered_preview"],
                            },
                        },
                        {
                            "name": "variant",
                            "in": "query",
                            "required": False,
                            "schema": {"type": "string", "enum": [QUICK_VARIANT]},
                            "description": QUICK_VARIANT_DESCRIPTION,
                        },
                    ],
                    "responses": {
                        "200": {
                            "description": "the artifact's bytes",
                            "content": {
                                "application/octet-stream": {
                                    "schema": {"type": "string", "format": "binary"}
                                },
                                "image/png": {"schema": {"type": "string", "format": "binary"}},
                            },
                        },
                        "302": {
                            "description": "redirect to a presigned object-storage URL",
                            "headers": {"Location": {"schema": {"type": "string"}}},
                        },
                        "400": _problem("invalid_request: an unknown `variant`"),
                        "409": _problem(
                            "not_ready: the job is not completed (with `variant=quick`: its "
                            "quick result is not ready yet)"
                        ),
                        **_COMMON,
                        "404": _problem(
                            "no such job (or another tenant's) or artifact; with "
                            "`variant=quick`, a job with no quick result (not progressive, or "
                            "ended without one)"
                        ),
                    },
                }
            },
            "/v1/jobs/{job_id}/events": {
                "get": {
                    "operationId": "jobEvents",
                    "description": "Server-Sent Events: `id:` (resume with Last-Event-ID), "
                    "`event:` (an event name) and `data:` (the webhook payload). The stream "
                    "ends after the terminal event; `: keep-alive` comments in between. Open "
                    "streams are capped per API key and per gateway (429 too_many_streams).",
                    "parameters": [
                        _JOB_ID,
                        {
                            "name": "Last-Event-ID",
                            "in": "header",
                            "required": False,
                            "schema": _EVENT_ID,
                            "description": "resume after this event (an `id:` of this stream)",
                        },
                        {
                            "name": "last_event_id",
                            "in": "query",
                            "required": False,
                            "schema": _EVENT_ID,
                            "description": "the same, for clients that cannot set headers; "
                            "the header wins when both are sent",
                        },
                    ],
                    "responses": {
                        "200": {
                            "description": "event stream",
                            "content": {"text/event-stream": {"schema": {"type": "string"}}},
                        },
                        "400": _problem("invalid_request: malformed Last-Event-ID"),
                        "429": _problem(
                            "too_many_streams: the API key's (SPLATQ_SSE_MAX_STREAMS_PER_TENANT)"
                            " or the gateway's (SPLATQ_SSE_MAX_STREAMS) open streams are at "
                            "their cap",
                            _RETRY_AFTER,
                        ),
                        **_COMMON,
                    },
                }
            },
            "/v1/jobs/{job_id}/deliveries": {
                "get": {
                    "operationId": "jobDeliveries",
                    "description": "Webhook delivery attempts for this job, oldest first.",
                    "parameters": [_JOB_ID],
                    "responses": {
                        "200": {
                            "description": "the attempts",
                            "content": {
                                "application/json": {
                                    "schema": {
                                        "type": "object",
                                        "required": ["job_id", "deliveries"],
                                        "properties": {
                                            "job_id": {"type": "string"},
                                            "deliveries": {
                                                "type": "array",
                                                "items": {
                                                    "$ref": "#/components/schemas/DeliveryAttempt"
                                                },
                                            },
                                        },
                                    }
                                }
                            },
                        },
                        **_COMMON,
                    },
                }
            },
            "/v1/webhook-secret": {
                "get": {
                    "operationId": "webhookSecret",
                    "description": "The tenant's whsec_ signing secret for per-job "
                    "webhook_urls (Standard Webhooks).",
                    "responses": _secret_responses("the secret"),
                }
            },
            "/v1/webhook-secret/rotate": {
                "post": {
                    "operationId": "rotateWebhookSecret",
                    "description": "A new tenant secret; the old one keeps signing (a second "
                    "signature) for 24 h (SPLATQ_WEBHOOK_ROTATION_OVERLAP_S).",
                    "responses": _secret_responses("the new secret"),
                }
            },
            **_endpoint_paths(event_names),
            **tenant_paths(),
            **console_paths(),
            "/healthz": {
                "get": {
                    "operationId": "healthz",
                    "security": [],
                    "responses": {
                        "200": {
                            "description": "the process is alive",
                            "content": {"application/json": {"schema": {"type": "object"}}},
                        }
                    },
                }
            },
            "/readyz": {
                "get": {
                    "operationId": "readyz",
                    "security": [],
                    "responses": {
                        "200": {
                            "description": "Redis is reachable",
                            "content": {"application/json": {"schema": {"type": "object"}}},
                        },
                        "503": _problem("not_ready"),
                    },
                }
            },
            "/metrics": {
                "get": {
                    "operationId": "metrics",
                    "security": [],
                    "responses": {
                        "200": {
                            "description": "Prometheus text format",
                            "content": {"text/plain": {"schema": {"type": "string"}}},
                        }
                    },
                }
            },
            "/openapi.json": {
                "get": {
                    "operationId": "openapi",
                    "security": [],
                    "responses": {
                        "200": {
                            "description": "this document",
                            "content": {"application/json": {"schema": {"type": "object"}}},
                        }
                    },
                }
            },
            "/docs": {
                "get": {
                    "operationId": "docs",
                    "security": [],
                    "description": "This document as a self-contained HTML page (no scripts, "
                    "no external resources).",
                    "responses": {
                        "200": {
                            "description": "HTML",
                            "content": {"text/html": {"schema": {"type": "string"}}},
                        }
                    },
                }
            },
        },
        "components": {
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "adminKey": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "SPLATQ_ADMIN_API_KEY (the /v1/admin/ paths only)",
                },
            },
            "schemas": {
                "Problem": {
                    "type": "object",
                    "required": ["type", "title", "status", "detail", "code"],
                    "properties": {
                        "type": {"type": "string"},
                        "title": {"type": "string"},
                        "status": {"type": "integer"},
                        "detail": {"type": "string"},
                        "code": {"type": "string", "enum": _PROBLEM_CODES},
                    },
                },
                "WebhookEndpoint": _ENDPOINT_SCHEMA,
                **TENANT_SCHEMAS,
                **CONSOLE_SCHEMAS,
                "DeliveryAttempt": _ATTEMPT_SCHEMA,
                "JobPage": {
                    "type": "object",
                    "required": ["items", "next_cursor", "next"],
                    "properties": {
                        "items": {"type": "array", "items": {"$ref": "#/components/schemas/Job"}},
                        "next_cursor": {"type": ["string", "null"]},
                        "next": {"type": ["string", "null"], "description": "the next page's URL"},
                    },
                },
                **_event_schemas(),
                "JobStage": JOB_STAGE,
                "Job": {
                    "type": "object",
                    "required": [
                        "id",
                        "status",
                        "quality",
                        "stream",
                        "created_at",
                        "attempts",
                        "progress",
                        "current_stage",
                        "stages",
                        "cached",
                        "error",
                        "artifacts",
                        "metadata",
                        "urls",
                    ],
                    "properties": {
                        "id": {"type": "string", "pattern": "^job_[0-9]{3}[0-9A-Z]{26}$"},
                        "status": {
                            "type": "string",
                            "enum": [
                                "queued",
                                "processing",
                                "retrying",
                                "completed",
                                "failed",
                                "canceled",
                            ],
                        },
                        "quality": {"type": "string", "enum": ["preview", "full"]},
                        "stream": {"type": "string", "enum": ["interactive", "synthesis"]},
                        "created_at": {"type": "string", "format": "date-time"},
                        "started_at": {"type": ["string", "null"], "format": "date-time"},
                        "completed_at": {"type": ["string", "null"], "format": "date-time"},
                        "attempts": {"type": "integer", "minimum": 0},
                        "deliveries": {
                            "type": "integer",
                            "minimum": 0,
                            "description": "times a worker took the job (released ones not"
                            " counted)",
                        },
                        "delivery_charge": {
                            "type": "number",
                            "minimum": 0,
                            "description": "worker deaths charged to the job: 1/k each when k"
                            " jobs shared the dying worker; SPLATQ_MAX_DELIVERIES applies to it",
                        },
                        "progress": {"type": "number", "minimum": 0, "maximum": 1},
                        "stage": {"type": "string"},
                        **JOB_PROPERTIES,
                        "cached": {"type": "boolean"},
                        "model": {"type": ["string", "null"]},
                        "compute_time_ms": {"type": ["integer", "null"]},
                        "error": {"oneOf": [{"type": "null"}, JOB_ERROR]},
                        "artifacts": {
                            "oneOf": [
                                {"type": "null"},
                                {
                                    "type": "object",
                                    "properties": {
                                        n: {"type": "string"}
                                        for n in ("gaussian_ply", "splat", "rendered_preview")
                                    },
                                },
                            ]
                        },
                        "metadata": {"type": "object"},
                        "urls": {
                            "type": "object",
                            "required": ["get", "cancel", "events"],
                            "properties": {
                                k: {"type": "string"} for k in ("get", "cancel", "events")
                            },
                        },
                    },
                    "examples": [_JOB_EXAMPLE],
                },
            },
        },
    }


_TIME_OR_NULL = {"type": ["string", "null"], "format": "date-time"}
_JOB_EXAMPLE: dict[str, Any] = {
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
    "cached": False, "model": "builtin", "compute_time_ms": 3430,
    "error": None,
    "artifacts": {
        "gaussian_ply": "https://api.example.com/v1/jobs/job_00006H2ZREWFRZ99JDC12Z65BYVF8/"
        "artifacts/gaussian_ply",
        "splat": "https://api.example.com/v1/jobs/job_00006H2ZREWFRZ99JDC12Z65BYVF8/"
        "artifacts/splat",
        "rendered_preview": "https://api.example.com/v1/jobs/job_00006H2ZREWFRZ99JDC12Z65BYVF8/"
        "artifacts/rendered_preview",
    },
    "metadata": {"order": "A-1042"},
    "urls": {"get": "https://api.example.com/v1/jobs/job_00006H2ZREWFRZ99JDC12Z65BYVF8",
             "cancel": "https://api.example.com/v1/jobs/job_00006H2ZREWFRZ99JDC12Z65BYVF8/cancel",
             "events": "https://api.example.com/v1/jobs/job_00006H2ZREWFRZ99JDC12Z65BYVF8/events"},
}  # fmt: skip
# One delivery attempt, as the dispatcher records it (services/webhook_dispatcher/
# dispatcher.py `_attempt_record`): GET /v1/jobs/{id}/deliveries and the endpoint attempt log.
_ATTEMPT_SCHEMA: dict[str, Any] = {
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
_ATTEMPT_PAGE: dict[str, Any] = {
    "type": "object",
    "required": ["endpoint_id", "items", "next_cursor", "next"],
    "properties": {
        "endpoint_id": {"type": "string"},
        "items": {"type": "array", "items": {"$ref": "#/components/schemas/DeliveryAttempt"}},
        "next_cursor": {"type": ["string", "null"]},
        "next": {"type": ["string", "null"]},
    },
}
_ARTIFACT_URLS = {
    "type": "object",
    "properties": {n: {"type": "string"} for n in ("gaussian_ply", "splat", "rendered_preview")},
}
# What each event adds to `data` (shared/engine/events.py builds the same fragments).
_EVENT_DATA: dict[str, dict[str, Any]] = {
    EventType.QUEUED.value: {"quality": {"type": "string", "enum": list(QUALITIES)},
                             "stream": {"type": "string"}},
    EventType.STARTED.value: {"attempt": {"type": "integer", "minimum": 1}},
    EventType.PROGRESS.value: {"progress": {"type": "number", "minimum": 0, "maximum": 1},
                               "stage": {"type": "string"}},
    EventType.PREVIEW_READY.value: {"model": {"type": "string"},
                                    "compute_time_ms": {"type": "integer"},
                                    "resolution": {"type": "integer", "minimum": 1},
                                    "artifacts": _ARTIFACT_URLS},
    EventType.COMPLETED.value: {"model": {"type": "string"},
                                "compute_time_ms": {"type": "integer"},
                                "artifacts": _ARTIFACT_URLS},
    EventType.FAILED.value: {"error_code": {"type": "string"}, "message": {"type": "string"},
                             "retryable": {"type": "boolean"}},
    EventType.CANCELED.value: {},
}  # fmt: skip
# Members an event may carry besides its required ones.
_EVENT_OPTIONAL: dict[str, dict[str, Any]] = {EventType.PROGRESS.value: PROGRESS_STAGE_MEMBERS}
# What a receiver should know of an event, besides its payload schema.
_EVENT_NOTES: dict[str, str] = {
    EventType.PROGRESS.value: PROGRESS_DESCRIPTION,
    EventType.PREVIEW_READY.value: PREVIEW_READY_DESCRIPTION,
}


def _schema_name(event: str) -> str:
    """`3d_reconstruction.completed` -> `CompletedEvent`, `webhook.test` -> `TestEvent`."""
    return event.rsplit(".", 1)[1].capitalize() + "Event"


def _event_schemas() -> dict[str, Any]:
    """One payload schema per event: what webhooks deliver and SSE `data:` carries."""
    out: dict[str, Any] = {}
    for event, extra in _EVENT_DATA.items():
        out[_schema_name(event)] = {
            "type": "object",
            "required": ["event", "id", "timestamp", "data"],
            "properties": {
                "event": {"const": event},
                "id": {"type": "string", "description": "evt_…, the webhook-id header"},
                "timestamp": {"type": "integer", "description": "Unix seconds"},
                "data": {
                    "type": "object",
                    "required": ["job_id", "metadata", *extra],
                    "properties": {"job_id": {"type": "string"}, "metadata": {"type": "object"},
                                   **extra, **_EVENT_OPTIONAL.get(event, {})},
                },
            },
        }  # fmt: skip
    out[_schema_name(TEST_EVENT)] = {
        "type": "object",
        "required": ["event", "id", "timestamp", "data"],
        "properties": {
            "event": {"const": TEST_EVENT},
            "id": {"type": "string"},
            "timestamp": {"type": "integer"},
            "data": {"type": "object", "required": ["endpoint_id"],
                     "properties": {"endpoint_id": {"type": "string"},
                                    "message": {"type": "string"}}},
        },
    }  # fmt: skip
    completed = out[_schema_name(EventType.COMPLETED.value)]
    completed["examples"] = [{
        "event": EventType.COMPLETED.value, "id": "evt_06H2ZREWFVDJYKDAM8D9CVSYDR",
        "timestamp": 1764581403,
        "data": {"job_id": _JOB_EXAMPLE["id"], "metadata": {"order": "A-1042"},
                 "model": "builtin", "compute_time_ms": 3430,
                 "artifacts": _JOB_EXAMPLE["artifacts"]},
    }]  # fmt: skip
    return out


def _webhooks() -> dict[str, Any]:
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
                    "schema": {"$ref": f"#/components/schemas/{_schema_name(event)}"}}}},
                "responses": {"2XX": {"description": "received"},
                              "410": {"description": "stop sending (disables an endpoint)"}},
            }
        }  # fmt: skip
    return out


_ENDPOINT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["id", "url", "events", "enabled", "created_at", "health", "urls"],
    "properties": {
        "id": {"type": "string", "pattern": "^ep_[0-9A-Z]{26}$"},
        "url": {"type": "string"},
        "events": {"type": "array", "items": {"type": "string"},
                   "description": "subscribed event types; empty means every event"},
        "enabled": {"type": "boolean"},
        "created_at": {"type": "string", "format": "date-time"},
        "disabled_at": _TIME_OR_NULL,
        "disabled_reason": {"type": ["string", "null"]},
        "health": {
            "type": "object",
            "required": ["circuit", "consecutive_failures"],
            "properties": {
                "circuit": {"type": "string", "enum": ["closed", "open", "half_open"]},
                "open_until": _TIME_OR_NULL,
                "consecutive_failures": {"type": "integer", "minimum": 0},
                "failing_since": _TIME_OR_NULL,
                "last_success_at": _TIME_OR_NULL,
                "last_failure_at": _TIME_OR_NULL,
            },
        },
        "headers": {"type": "object", "additionalProperties": {"type": "string"},
                    "description": "custom headers sent with every delivery"},
        "previous_secret_expires_at": _TIME_OR_NULL,
        "secret": {"type": "string", "pattern": "^whsec_",
                   "description": "only when created and after a rotation"},
        "urls": {"type": "object", "properties": {"self": {"type": "string"}}},
    },
}  # fmt: skip
_ENDPOINT_ID = {
    "name": "endpoint_id", "in": "path", "required": True,
    "schema": {"type": "string", "maxLength": 64},
}  # fmt: skip
_ENDPOINT = {"application/json": {"schema": {"$ref": "#/components/schemas/WebhookEndpoint"}}}
_ENDPOINT_404 = {
    "401": _problem("missing or unknown API key"),
    "404": _problem("no such webhook endpoint (or another tenant's)"),
    "503": _UNAVAILABLE,
}
_JSON_BODY_ERRORS = {
    "400": _problem("invalid_request: bad JSON, unknown field, bad url or event name"),
    "413": _problem("payload_too_large: the body exceeds 16 KB"),
    "415": _problem("unsupported_media_type: the body must be application/json"),
}


def _json_request(schema: dict[str, Any], required: bool = True) -> dict[str, Any]:
    return {"required": required, "content": {"application/json": {"schema": schema}}}


def _endpoint_paths(event_names: list[str]) -> dict[str, Any]:
    events = {"type": "array", "items": {"type": "string", "enum": event_names}}
    url = {"type": "string", "maxLength": 2048}
    headers = {
        "type": ["object", "null"],
        "maxProperties": custom_headers.MAX_HEADERS,
        "propertyNames": {
            "maxLength": custom_headers.MAX_NAME,
            "pattern": "^[!#$%&'*+.^_`|~0-9A-Za-z-]+$",
        },
        "additionalProperties": {"type": "string", "maxLength": custom_headers.MAX_VALUE},
        "description": "custom headers sent with every delivery; hop-by-hop, framing, "
        "User-Agent and webhook-* (signature) headers are refused; at most "
        f"{custom_headers.MAX_TOTAL} bytes in all; PATCH replaces the set, null clears it",
        "examples": [{"X-Api-Key": "rk_live_4f1c"}],
    }
    return {
        "/v1/webhook-endpoints": {
            "post": {
                "operationId": "createWebhookEndpoint",
                "description": "Register an endpoint for the tenant's job events; the answer "
                "carries its own whsec_ secret.",
                "requestBody": _json_request({
                    "type": "object", "required": ["url"], "additionalProperties": False,
                    "properties": {"url": url, "events": events, "headers": headers},
                }),
                "responses": {
                    "201": {"description": "created", "content": _ENDPOINT,
                            "headers": {"Location": {"schema": {"type": "string"}}}},
                    **_JSON_BODY_ERRORS,
                    "401": _problem("missing or unknown API key"),
                    "409": _problem("endpoint_limit_reached"),
                },
            },
            "get": {
                "operationId": "listWebhookEndpoints",
                "responses": {
                    "200": {"description": "the tenant's endpoints", "content": {
                        "application/json": {"schema": {
                            "type": "object", "required": ["data"],
                            "properties": {"data": {"type": "array", "items": {
                                "$ref": "#/components/schemas/WebhookEndpoint"}}},
                        }}}},
                    "401": _problem("missing or unknown API key"),
                },
            },
        },
        "/v1/webhook-endpoints/{endpoint_id}": {
            "get": {
                "operationId": "getWebhookEndpoint",
                "parameters": [_ENDPOINT_ID],
                "responses": {"200": {"description": "the endpoint and its health",
                                      "content": _ENDPOINT}, **_ENDPOINT_404},
            },
            "patch": {
                "operationId": "updateWebhookEndpoint",
                "description": "Change url, events or enabled; enabling clears the failure "
                "record and closes the circuit.",
                "parameters": [_ENDPOINT_ID],
                "requestBody": _json_request({
                    "type": "object", "additionalProperties": False,
                    "properties": {"url": url, "events": events, "enabled": {"type": "boolean"},
                                   "headers": headers},
                }),
                "responses": {"200": {"description": "updated", "content": _ENDPOINT},
                              **_JSON_BODY_ERRORS, **_ENDPOINT_404},
            },
            "delete": {
                "operationId": "deleteWebhookEndpoint",
                "parameters": [_ENDPOINT_ID],
                "responses": {"204": {"description": "deleted"}, **_ENDPOINT_404},
            },
        },
        "/v1/webhook-endpoints/{endpoint_id}/rotate-secret": {
            "post": {
                "operationId": "rotateWebhookEndpointSecret",
                "description": "A new secret; the old one keeps signing (a second signature) "
                "for 24 h (SPLATQ_WEBHOOK_ROTATION_OVERLAP_S).",
                "parameters": [_ENDPOINT_ID],
                "responses": {"200": {"description": "the endpoint with its new secret",
                                      "content": _ENDPOINT}, **_ENDPOINT_404},
            },
        },
        "/v1/webhook-endpoints/{endpoint_id}/recover": {
            "post": {
                "operationId": "recoverWebhookEndpoint",
                "description": "Send again the endpoint's failed messages since a time (at "
                "most SPLATQ_WEBHOOK_RECOVER_LIMIT per call).",
                "parameters": [_ENDPOINT_ID],
                "requestBody": _json_request({
                    "type": "object", "required": ["since"], "additionalProperties": False,
                    "properties": {"since": {"type": "string", "format": "date-time"}},
                }),
                "responses": {
                    "202": {"description": "messages queued again", "content": {
                        "application/json": {"schema": {
                            "type": "object",
                            "required": ["recovered", "expired", "truncated"],
                            "properties": {
                                "endpoint_id": {"type": "string"},
                                "since": {"type": "string"},
                                "recovered": {"type": "integer", "minimum": 0},
                                "expired": {"type": "integer", "minimum": 0},
                                "truncated": {"type": "boolean"},
                                "limit": {"type": "integer"},
                            },
                        }}}},
                    **_JSON_BODY_ERRORS,
                    **_ENDPOINT_404,
                    "409": _problem("endpoint_disabled: enable the endpoint first"),
                },
            },
        },
        "/v1/webhook-endpoints/{endpoint_id}/test": {
            "post": {
                "operationId": "testWebhookEndpoint",
                "description": f"Send a `{TEST_EVENT}` event to this endpoint through the "
                "normal delivery path (signed, retried, logged in its attempts).",
                "parameters": [_ENDPOINT_ID],
                "responses": {
                    "202": {"description": "the event is on its way", "content": {
                        "application/json": {"schema": {
                            "type": "object",
                            "required": ["endpoint_id", "event", "event_id"],
                            "properties": {
                                "endpoint_id": {"type": "string"},
                                "event": {"const": TEST_EVENT},
                                "event_id": {"type": "string"},
                                "attempts_url": {"type": "string"},
                            },
                        }}}},
                    **_ENDPOINT_404,
                    "409": _problem("endpoint_disabled: enable the endpoint first"),
                },
            },
        },
        "/v1/webhook-endpoints/{endpoint_id}/attempts": {
            "get": {
                "operationId": "listWebhookEndpointAttempts",
                "description": "The endpoint's delivery attempts, newest first (the newest "
                "1,000 are kept).",
                "parameters": [
                    _ENDPOINT_ID,
                    {"name": "limit", "in": "query", "required": False,
                     "schema": {"type": "integer", "minimum": 1, "maximum": 100,
                                "default": 20}},
                    {"name": "cursor", "in": "query", "required": False,
                     "schema": {"type": "string", "pattern": "^[0-9]{1,19}-[0-9]{1,19}$"}},
                ],
                "responses": {
                    "200": {"description": "a page of attempts", "content": {
                        "application/json": {"schema": _ATTEMPT_PAGE}},
                        "headers": {"Link": {"schema": {"type": "string"}}}},
                    "400": _problem("invalid_request: bad limit or cursor"),
                    **_ENDPOINT_404,
                },
            },
        },
    }  # fmt: skip
