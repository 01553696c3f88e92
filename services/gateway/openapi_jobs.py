"""The jobs part of the OpenAPI document: submit (both encodings, typed), list, get, cancel,
artifacts, the event stream (SSE, each event modelled) and the delivery log; the Job schema
and the submission's (derived from services/gateway/shapes.py and shapes_requests.py).

A generated client must be able to submit from this alone: each encoding is one object schema
(never a top-level `oneOf`); the image / `image_url` rule is stated in words and, for
validators, in `if`/`then` and `dependentSchemas` that generators ignore.
"""

from __future__ import annotations

from typing import Any

from splatq.services.gateway import listing
from splatq.services.gateway.openapi_common import (
    REQUEST_TIMEOUT,
    RETRY_AFTER,
    UNAUTHORIZED,
    UNAVAILABLE,
    ok,
    problem,
)
from splatq.services.gateway.openapi_events import STREAM_ID
from splatq.services.gateway.openapi_stages import QUICK_VARIANT_DESCRIPTION
from splatq.services.gateway.shape_schema import components, ref
from splatq.services.gateway.shapes import (
    COMPONENT_NAMES,
    ArtifactUrls,
    Job,
    JobDeliveries,
    JobError,
    JobPage,
    schema,
)
from splatq.services.gateway.shapes_requests import (
    RULE,
    JobParams,
    SubmitJobForm,
    SubmitJobJson,
    ZonedTime,
)
from splatq.services.gateway.submission import MAX_IDEMPOTENCY_KEY, MAX_PREFER_LENGTH
from splatq.shared.storage.store import ARTIFACTS, QUICK_VARIANT

# A real 1x1 PNG: the example replays as an accepted submission.
PNG_1X1_DATA_URL = (
    "data:image/png;base64,"
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR42mM4UaEBAAN0AWn1BwN7AAAAAElFTkSuQmCC"
)
_JOB_ID = {
    "name": "job_id", "in": "path", "required": True,
    "schema": {"type": "string", "maxLength": 64},
}  # fmt: skip
_JOB = {"application/json": {"schema": ref("Job")}}
_COMMON = {"401": UNAUTHORIZED, "404": problem("no such job (or another tenant's)"),
           "503": UNAVAILABLE}  # fmt: skip
# The component schemas of this part, derived from the shapes.
SCHEMAS: dict[str, Any] = components(
    [JobParams, SubmitJobJson, SubmitJobForm, JobError, ArtifactUrls, JobPage], COMPONENT_NAMES
)
JOB_SCHEMA: dict[str, Any] = schema(Job)

_SUBMIT_RESPONSES: dict[str, Any] = {
    "202": {"description": "accepted (queued, or joined an identical in-flight job)",
            "content": _JOB,
            "headers": {"Location": {"schema": {"type": "string"}},
                        "Preference-Applied": {"schema": {"type": "string"},
                                               "description": "wait=N: the job did not end "
                                               "within it"}}},
    "200": {"description": "an identical completed job (cached: true), a repeat of a "
            "completed keyed request, or (`Prefer: wait`) a job that ended within the wait",
            "content": _JOB,
            "headers": {"Location": {"schema": {"type": "string"}},
                        "Preference-Applied": {"schema": {"type": "string"}}}},
    "400": problem("invalid_request: bad JSON, unknown or invalid param, neither or both of "
                   "image and image_url, a bad header"),
    "401": UNAUTHORIZED,
    "408": REQUEST_TIMEOUT,
    "413": problem("payload_too_large"),
    "415": problem("unsupported_media_type: not a PNG, JPEG, WebP, HEIC/HEIF or AVIF image "
                   "(by its magic bytes), or a HEIF/AVIF whose primary image is of another "
                   "codec"),
    "422": problem("invalid_image (undecodable, truncated, a header or ISO-BMFF box that runs "
                   "past the end), image_too_large (over SPLATQ_MAX_IMAGE_PIXELS, 80 MP by "
                   "default, or a side over 16,384, judged upright, or over "
                   "SPLATQ_MAX_DECODE_BYTES decoded), image_too_complex (JPEG scans; PNG, "
                   "WebP or HEIF structure counts: items, tiles, boxes), "
                   "idempotency_key_reused, "
                   "image_url_forbidden, image_url_unreachable or image_url_too_large"),
    "429": problem("rate_limited, too_many_decodes (the API key already has "
                   "SPLATQ_DECODE_CONCURRENCY_PER_TENANT uploads being decoded), "
                   "too_many_fetches (as many image_url fetches in flight), tenant_backlog_full, "
                   "or quota_exceeded (the tenant's GPU quota cannot hold the job's estimate; "
                   "Retry-After and `resets_at` say when the period resets)", RETRY_AFTER),
    "503": problem("overloaded (the queue is full), not_replicated, or unavailable (Redis or "
                   "storage unreachable)", RETRY_AFTER),
}  # fmt: skip


def _submit(max_wait_s: int) -> dict[str, Any]:
    prefer = {
        "name": "Prefer", "in": "header", "required": False,
        "schema": {"type": "string", "maxLength": MAX_PREFER_LENGTH},
        "description": f"`wait=N` (RFC 7240, as Replicate): answer 200 with the job if it ends "
        f"within N seconds (at most {max_wait_s}; `wait` alone waits that long), else the usual "
        f"202; `Preference-Applied` says so. Longer than {MAX_PREFER_LENGTH} characters: 400.",
        "examples": {"wait": {"value": "wait=30"}},
    }  # fmt: skip
    idempotency = {
        "name": "Idempotency-Key", "in": "header", "required": False,
        "schema": {"type": "string", "minLength": 1, "maxLength": MAX_IDEMPOTENCY_KEY,
                   "pattern": "^[\\x21-\\x7e]+$"},
        "description": "visible ASCII, no spaces (else, or empty, 400 invalid_request); same "
        "key + same request -> same job for 24 h; same key + different request -> 422 "
        "idempotency_key_reused",
    }  # fmt: skip
    examples = {
        "image_url": {"summary": "input by URL",
                      "value": {"image_url": "https://images.example.com/chair.png",
                                "quality": "preview", "metadata": {"order": "A-1042"}}},
        "base64": {"summary": "inline image (a data: URL of a 1x1 PNG)",
                   "value": {"image": PNG_1X1_DATA_URL, "quality": "preview",
                             "webhook_url": "https://hooks.example.com/splatq",
                             "webhook_events": ["3d_reconstruction.completed"]}},
    }  # fmt: skip
    return {
        "operationId": "submitJob",
        "description": f"{RULE} Multipart: an `image` file part (or an `image_url` text part) "
        "and an optional `params` part, a JSON object. JSON: the image as base64 (or a data: "
        "URL) in `image`, or `image_url`, with the params as members.",
        "parameters": [prefer, idempotency],
        "requestBody": {
            "required": True,
            "content": {
                "multipart/form-data": {
                    "schema": ref("SubmitJobForm"),
                    "encoding": {"params": {"contentType": "application/json"}},
                },
                "application/json": {"schema": ref("SubmitJobJson"), "examples": examples},
            },
        },
        "responses": _SUBMIT_RESPONSES,
    }


def _list_jobs() -> dict[str, Any]:
    return {
        "operationId": "listJobs",
        "description": "The caller's jobs, newest first. A page examines a bounded number of "
        "the tenant's jobs (4 per item of `limit`, at least 32), so with a status filter it may "
        "come back short (even empty) with a next_cursor: follow it until it is null. Listings "
        "have a per-tenant rate limit of their own (429 rate_limited).",
        "parameters": [
            {"name": "status", "in": "query", "required": False, "style": "form",
             "explode": True, "schema": {"type": "array", "items": ref("JobStatus")},
             "description": "jobs in any of these statuses; repeat the parameter (a value "
             "separated with commas is read the same way)"},
            {"name": "created_since", "in": "query", "required": False, "schema": schema(ZonedTime),
             "description": "created at or after (RFC 3339 with a zone)"},
            {"name": "created_until", "in": "query", "required": False, "schema": schema(ZonedTime),
             "description": "created before (RFC 3339 with a zone)"},
            {"name": "limit", "in": "query", "required": False,
             "schema": {"type": "integer", "minimum": 1, "maximum": listing.MAX_LIMIT,
                        "default": listing.DEFAULT_LIMIT}},
            {"name": "cursor", "in": "query", "required": False,
             "schema": {"type": "string", "minLength": 1, "maxLength": 512,
                        "pattern": "^[A-Za-z0-9_-]+$"},
             "description": "the previous page's next_cursor, with the same filters (a value "
             "this API did not return, or made for other filters, is refused: 400)"},
        ],
        "responses": {
            "200": {"description": "a page of jobs",
                    "content": {"application/json": {"schema": ref("JobPage")}},
                    "headers": {"Link": {"schema": {"type": "string"},
                                         "description": '<next>; rel="next"'}}},
            "400": problem("invalid_request: bad status, time, limit or cursor"),
            "401": UNAUTHORIZED,
            "429": problem("rate_limited: this API key's listings are over "
                           "SPLATQ_LIST_RATE_LIMIT_PER_S (burst SPLATQ_LIST_RATE_LIMIT_BURST)",
                           RETRY_AFTER),
            "503": UNAVAILABLE,
        },
    }  # fmt: skip


def _artifact() -> dict[str, Any]:
    binary = {"schema": {"type": "string", "format": "binary"}}
    return {
        "operationId": "getArtifact",
        "parameters": [
            _JOB_ID,
            {"name": "name", "in": "path", "required": True,
             "schema": {"type": "string", "enum": list(ARTIFACTS)}},
            {"name": "variant", "in": "query", "required": False,
             "schema": {"type": "string", "enum": [QUICK_VARIANT]},
             "description": QUICK_VARIANT_DESCRIPTION},
        ],
        "responses": {
            "200": {"description": "the artifact's bytes",
                    "content": {"application/octet-stream": binary, "image/png": binary}},
            "302": {"description": "redirect to a presigned object-storage URL",
                    "headers": {"Location": {"schema": {"type": "string"}}}},
            "400": problem("invalid_request: an unknown `variant`"),
            "409": problem("not_ready: the job is not completed (with `variant=quick`: its "
                           "quick result is not ready yet)"),
            **_COMMON,
            "404": problem("no such job (or another tenant's) or artifact; with "
                           "`variant=quick`, a job with no quick result (not progressive, or "
                           "ended without one)"),
        },
    }  # fmt: skip


def _events() -> dict[str, Any]:
    event_id = {"type": "string", "pattern": STREAM_ID}
    return {
        "operationId": "jobEvents",
        "description": "Server-Sent Events: `id:` (resume with Last-Event-ID), `event:` (an "
        "event name) and `data:` (the webhook payload, one of the event schemas). The stream "
        "ends after the terminal event; `: keep-alive` comments in between. Open streams are "
        "capped per API key and per gateway (429 too_many_streams). Each event is described by "
        "the media type's `itemSchema` (OpenAPI 3.2's keyword for one item of a stream); a "
        "client generated from OpenAPI 3.1 tooling reads the whole stream as one body, so it "
        "returns only after the job ended: read events one by one with an SSE client (the "
        "Python client's `events()`, or any EventSource).",
        "parameters": [
            _JOB_ID,
            {"name": "Last-Event-ID", "in": "header", "required": False, "schema": event_id,
             "description": "resume after this event (an `id:` of this stream)"},
            {"name": "last_event_id", "in": "query", "required": False, "schema": event_id,
             "description": "the same, for clients that cannot set headers; the header wins "
             "when both are sent"},
        ],
        "responses": {
            "200": {"description": "event stream",
                    "content": {"text/event-stream": {"itemSchema": ref("JobStreamEvent")}}},
            "400": problem("invalid_request: malformed Last-Event-ID"),
            "429": problem("too_many_streams: the API key's (SPLATQ_SSE_MAX_STREAMS_PER_TENANT)"
                           " or the gateway's (SPLATQ_SSE_MAX_STREAMS) open streams are at "
                           "their cap", RETRY_AFTER),
            **_COMMON,
        },
    }  # fmt: skip


def job_paths(max_wait_s: int) -> dict[str, Any]:
    return {
        "/v1/jobs": {"post": _submit(max_wait_s), "get": _list_jobs()},
        "/v1/jobs/{job_id}": {
            "get": {"operationId": "getJob", "parameters": [_JOB_ID],
                    "responses": {"200": {"description": "the job", "content": _JOB},
                                  **_COMMON}},
        },
        "/v1/jobs/{job_id}/cancel": {
            "post": {"operationId": "cancelJob", "parameters": [_JOB_ID],
                     "responses": {"202": {"description": "canceled, or processing until the "
                                           "worker stops", "content": _JOB},
                                   "409": problem("already_finished"), **_COMMON}},
        },
        "/v1/jobs/{job_id}/artifacts/{name}": {"get": _artifact()},
        "/v1/jobs/{job_id}/events": {"get": _events()},
        "/v1/jobs/{job_id}/deliveries": {
            "get": {"operationId": "jobDeliveries",
                    "description": "Webhook delivery attempts for this job, oldest first.",
                    "parameters": [_JOB_ID],
                    "responses": {**ok("the attempts", schema(JobDeliveries)), **_COMMON}},
        },
    }  # fmt: skip
