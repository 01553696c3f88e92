"""The OpenAPI 3.1 description of the gateway's HTTP API (hand-written, served at
/openapi.json); a test checks every route is described and a schemathesis run checks it is true.
"""

from __future__ import annotations

from typing import Any

from splatq.services.gateway.openapi_tenants import SCHEMAS as TENANT_SCHEMAS
from splatq.services.gateway.openapi_tenants import tenant_paths
from splatq.shared import __version__
from splatq.shared.engine.events import EventType

_PROBLEM_CODES = [
    "invalid_request", "unauthorized", "not_found", "method_not_allowed", "already_finished",
    "not_ready", "payload_too_large", "unsupported_media_type", "invalid_image",
    "image_too_complex", "too_many_decodes",
    "image_too_large", "idempotency_key_reused", "rate_limited", "tenant_backlog_full",
    "overloaded",
    "internal_error", "endpoint_limit_reached", "endpoint_disabled", "too_many_streams",
    "unavailable", "not_replicated", "quota_exceeded", "forbidden", "admin_disabled",
    "tenant_exists",
]  # fmt: skip


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


def openapi_document(server_url: str) -> dict[str, Any]:
    event_names = [e.value for e in EventType]
    params_props: dict[str, Any] = {
        "quality": {"type": "string", "enum": ["preview", "full"], "default": "full"},
        "webhook_url": {"type": "string", "format": "uri", "maxLength": 2048},
        "webhook_events": {"type": "array", "items": {"type": "string", "enum": event_names}},
        "metadata": {"type": "object", "description": "at most 4 KB as JSON"},
        "cache": {"type": "boolean", "default": True},
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "splatq",
            "version": __version__,  # the package's version; the API itself is /v1
            "description": "Asynchronous image → 3D Gaussian Splatting jobs. Submit an image, "
            "get a job id at once (202), follow it by polling, Server-Sent Events or webhooks.",
        },
        "servers": [{"url": server_url}],
        "security": [{"bearer": []}],
        "paths": {
            "/v1/jobs": {
                "post": {
                    "operationId": "submitJob",
                    "summary": "Submit an image for reconstruction",
                    "parameters": [
                        {
                            "name": "Idempotency-Key",
                            "in": "header",
                            "required": False,
                            "schema": {
                                "type": "string",
                                "minLength": 1,
                                "maxLength": 255,
                                "pattern": "^[\\x21-\\x7e]+$",
                            },
                            "description": "visible ASCII, no spaces (else 400 invalid_request); "
                            "same key + same request -> same job for 24 h; "
                            "same key + different request -> 422 idempotency_key_reused",
                        }
                    ],
                    "requestBody": {
                        "required": True,
                        "content": {
                            "multipart/form-data": {
                                "schema": {
                                    "type": "object",
                                    "required": ["image"],
                                    "properties": {
                                        "image": {"type": "string", "format": "binary"},
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
                                    "required": ["image"],
                                    "additionalProperties": False,
                                    "properties": {
                                        "image": {
                                            "type": "string",
                                            "description": "base64 or a data: URL",
                                        },
                                        **params_props,
                                    },
                                }
                            },
                        },
                    },
                    "responses": {
                        "202": {
                            "description": "accepted (queued, or joined an identical "
                            "in-flight job)",
                            "content": _JOB,
                            "headers": {"Location": {"schema": {"type": "string"}}},
                        },
                        "200": {
                            "description": "an identical completed job (cached: true), "
                            "or a repeat of a completed keyed request",
                            "content": _JOB,
                        },
                        "400": _problem("invalid_request: bad JSON, unknown or invalid param"),
                        "401": _problem("unauthorized"),
                        "413": _problem("payload_too_large"),
                        "415": _problem("unsupported_media_type"),
                        "422": _problem(
                            "invalid_image, image_too_large, image_too_complex or "
                            "idempotency_key_reused"
                        ),
                        "429": _problem(
                            "rate_limited, or too_many_decodes (the API key already has "
                            "SPLATQ_DECODE_CONCURRENCY_PER_TENANT uploads being decoded), or "
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
                }
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
                        "409": _problem("not_ready: the job is not completed"),
                        **_COMMON,
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
                                                "items": {"type": "object"},
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
                        "cached": {"type": "boolean"},
                        "model": {"type": ["string", "null"]},
                        "compute_time_ms": {"type": ["integer", "null"]},
                        "error": {
                            "oneOf": [
                                {"type": "null"},
                                {
                                    "type": "object",
                                    "required": ["code", "message", "retryable"],
                                    "properties": {
                                        "code": {"type": "string"},
                                        "message": {"type": "string"},
                                        "retryable": {"type": "boolean"},
                                    },
                                },
                            ]
                        },
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
                },
            },
        },
    }


_TIME_OR_NULL = {"type": ["string", "null"], "format": "date-time"}
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
    return {
        "/v1/webhook-endpoints": {
            "post": {
                "operationId": "createWebhookEndpoint",
                "description": "Register an endpoint for the tenant's job events; the answer "
                "carries its own whsec_ secret.",
                "requestBody": _json_request({
                    "type": "object", "required": ["url"], "additionalProperties": False,
                    "properties": {"url": url, "events": events},
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
                    "properties": {"url": url, "events": events, "enabled": {"type": "boolean"}},
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
    }  # fmt: skip
