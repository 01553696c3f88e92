"""Pieces every part of the OpenAPI document uses: problem answers, shared parameters and
the named enums (one component each, so a generated client gets one class per concept). The
schemas themselves are derived from the shapes (services/gateway/shapes*.py).

Names come from the modules that define them (engine states and stages, events, the shapes),
so the document and the server cannot drift apart on those.
"""

from __future__ import annotations

from typing import Any, get_args

from splatq.services.gateway.shape_schema import ref
from splatq.services.gateway.shapes import Quality, schema
from splatq.shared.engine.events import EventType
from splatq.shared.engine.keys import StreamName
from splatq.shared.engine.stages import PIPELINE
from splatq.shared.engine.states import JobStatus

# Named enums: referenced wherever the concept appears (a generator makes one class of each).
ENUMS: dict[str, dict[str, Any]] = {
    "JobStatus": {"type": "string", "enum": [s.value for s in JobStatus]},
    "Quality": {"type": "string", "enum": list(get_args(Quality))},
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


def nullable(name: str, description: str = "") -> dict[str, Any]:
    """`name` or null, as one `anyOf` (a generator makes `Name | None`, not a class per branch)."""
    out: dict[str, Any] = {"anyOf": [ref(name), {"type": "null"}]}
    if description:
        out["description"] = description
    return out


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


def json_request(shape: type, required: bool = True) -> dict[str, Any]:
    """A JSON request body of `shape` (services/gateway/shapes_requests.py)."""
    return {"required": required, "content": {"application/json": {"schema": schema(shape)}}}


REQUEST_TIMEOUT = problem(
    "request_timeout: the body did not arrive within SPLATQ_BODY_TIMEOUT_S (60 s); the "
    "connection is closed"
)
UNAUTHORIZED = problem("unauthorized: missing or unknown API key")
UNAVAILABLE = problem("unavailable: Redis or storage unreachable; retry later", RETRY_AFTER)
# Sent by the HTTP layer itself for a request it cannot read (a malformed request line or
# headers, Content-Length with Transfer-Encoding): declared on every operation.
MALFORMED = problem("invalid_request: a malformed request (bad JSON, parameter or HTTP framing)")
