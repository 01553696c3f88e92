"""Pieces every part of the OpenAPI document uses: problem answers, shared parameters, the
named enums (one component each, so a generated client gets one class per concept) and the
Problem schema with its open-ended `code`.

Names come from the modules that define them (engine states and stages, events, submission),
so the document and the server cannot drift apart on those.
"""

from __future__ import annotations

from typing import Any

from splatq.services.gateway.submission import QUALITIES
from splatq.shared.engine.events import EventType
from splatq.shared.engine.keys import StreamName
from splatq.shared.engine.stages import PIPELINE
from splatq.shared.engine.states import JobStatus

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
PROBLEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "RFC 9457 problem details; every error answer of the API is one.",
    "required": ["type", "title", "status", "detail", "code"],
    "properties": {
        "type": {"type": "string"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "code": {
            "type": "string",
            "description": "a stable machine-readable code; known values: "
            + ", ".join(f"`{c}`" for c in PROBLEM_CODES)
            + ". New codes may be added: treat an unknown one by its HTTP status.",
            "examples": ["invalid_request", "quota_exceeded"],
        },
        "resets_at": {"type": "string", "format": "date-time",
                      "description": "quota_exceeded: when the quota period resets"},
    },
}  # fmt: skip

# Named enums: referenced wherever the concept appears (a generator makes one class of each).
ENUMS: dict[str, dict[str, Any]] = {
    "JobStatus": {"type": "string", "enum": [s.value for s in JobStatus]},
    "Quality": {"type": "string", "enum": list(QUALITIES)},
    "JobStream": {"type": "string", "enum": [s.value for s in StreamName]},
    "PipelineStage": {"type": "string", "enum": [s.value for s in PIPELINE]},
    # Values that are no identifiers get names (openapi-python-client and openapi-generator
    # read `x-enum-varnames`): EventName.COMPLETED, not EventName.VALUE_3.
    "EventName": {
        "type": "string",
        "enum": [e.value for e in EventType],
        "x-enum-varnames": [e.value.rsplit(".", 1)[1].upper() for e in EventType],
    },
}


def ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def nullable(name: str, description: str = "") -> dict[str, Any]:
    """`name` or null, as one `anyOf` (a generator makes `Name | None`, not a class per branch)."""
    out: dict[str, Any] = {"anyOf": [ref(name), {"type": "null"}]}
    if description:
        out["description"] = description
    return out


# RFC 3339 with a zone (the server refuses a time without one: 400 invalid_request).
ZONED_TIME: dict[str, Any] = {
    "type": "string",
    "format": "date-time",
    "pattern": "([Zz]|[+-][0-9]{2}:[0-9]{2})$",
    "description": "RFC 3339 with a zone (`Z` or ±hh:mm); a time without one is refused",
}
TIME_OR_NULL: dict[str, Any] = {"type": ["string", "null"], "format": "date-time"}
RETRY_AFTER = {"Retry-After": {"schema": {"type": "string"}, "description": "seconds"}}
# On every answer that carries a secret (and every admin answer): no cache keeps a copy.
NO_STORE_HEADER = {"Cache-Control": {"schema": {"type": "string", "const": "no-store"}}}
PROBLEM_CONTENT = {"application/problem+json": {"schema": ref("Problem")}}


def problem(description: str, headers: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"description": description, "content": PROBLEM_CONTENT}
    if headers:
        out["headers"] = headers
    return out


def ok(
    description: str, schema: dict[str, Any], status: str = "200", headers: Any = None
) -> dict[str, Any]:
    out: dict[str, Any] = {"description": description,
                           "content": {"application/json": {"schema": schema}}}  # fmt: skip
    if headers:
        out["headers"] = headers
    return {status: out}


def json_request(schema: dict[str, Any], required: bool = True) -> dict[str, Any]:
    return {"required": required, "content": {"application/json": {"schema": schema}}}


# What check_url (shared/webhooks/ssrf.py) refuses by syntax alone: a scheme other than https,
# no host, userinfo, whitespace, control characters or backslashes. Its host policy (no IP
# literal, no local or single-label name) is stated in words: 400 invalid_request.
HTTPS_URL_PATTERN = (
    "^[Hh][Tt][Tt][Pp][Ss]://[^\\x00-\\x20\\x7f\\\\/?#@]+([/?#][^\\x00-\\x20\\x7f\\\\]*)?$"
)
# The same for `image_url`, where http is accepted too.
HTTP_URL_PATTERN = HTTPS_URL_PATTERN.replace("[Ss]://", "[Ss]?://", 1)
REQUEST_TIMEOUT = problem(
    "request_timeout: the body did not arrive within SPLATQ_BODY_TIMEOUT_S (60 s); the "
    "connection is closed"
)
UNAUTHORIZED = problem("unauthorized: missing or unknown API key")
UNAVAILABLE = problem("unavailable: Redis or storage unreachable; retry later", RETRY_AFTER)
# Sent by the HTTP layer itself for a request it cannot read (a malformed request line or
# headers, Content-Length with Transfer-Encoding): declared on every operation.
MALFORMED = problem("invalid_request: a malformed request (bad JSON, parameter or HTTP framing)")
