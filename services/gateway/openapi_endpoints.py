"""Webhooks in the OpenAPI document: the registered endpoints (`/v1/webhook-endpoints`), their
secrets and attempt logs, and the tenant's secret for per-job webhook_urls. The schemas are
derived from the shapes (services/gateway/shapes.py, shapes_requests.py)."""

from __future__ import annotations

from typing import Any

from splatq.services.gateway.openapi_common import (
    NO_STORE_HEADER,
    REQUEST_TIMEOUT,
    UNAUTHORIZED,
    UNAVAILABLE,
    json_request,
    ok,
    problem,
)
from splatq.services.gateway.openapi_events import STREAM_ID
from splatq.services.gateway.shape_schema import ref
from splatq.services.gateway.shapes import (
    EndpointList,
    Recovered,
    SentTestEvent,
    TenantSecret,
    WebhookEndpoint,
    schema,
)
from splatq.services.gateway.shapes_requests import EndpointCreate, EndpointUpdate, RecoverRequest
from splatq.shared.webhooks.store import TEST_EVENT

ENDPOINT_SCHEMA: dict[str, Any] = schema(WebhookEndpoint)
_ENDPOINT_ID = {
    "name": "endpoint_id", "in": "path", "required": True,
    "schema": {"type": "string", "maxLength": 64},
}  # fmt: skip
_ENDPOINT = {"application/json": {"schema": ref("WebhookEndpoint")}}
_ENDPOINT_404 = {
    "401": UNAUTHORIZED,
    "404": problem("no such webhook endpoint (or another tenant's)"),
    "503": UNAVAILABLE,
}
_JSON_BODY_ERRORS = {
    "400": problem("invalid_request: bad JSON, unknown field, bad url or event name"),
    "408": REQUEST_TIMEOUT,
    "413": problem("payload_too_large: the body exceeds 16 KB"),
    "415": problem("unsupported_media_type: the body must be application/json"),
}


def _secret_responses(description: str) -> dict[str, Any]:
    """The answers of GET /v1/webhook-secret and POST /v1/webhook-secret/rotate."""
    answer = schema(TenantSecret)
    return {**ok(description, answer, headers=NO_STORE_HEADER), "401": UNAUTHORIZED,
            "503": UNAVAILABLE}  # fmt: skip


def secret_paths() -> dict[str, Any]:
    return {
        "/v1/webhook-secret": {
            "get": {"operationId": "webhookSecret",
                    "description": "The tenant's whsec_ signing secret for per-job "
                    "webhook_urls (Standard Webhooks).",
                    "responses": _secret_responses("the secret")},
        },
        "/v1/webhook-secret/rotate": {
            "post": {"operationId": "rotateWebhookSecret",
                     "description": "A new tenant secret; the old one keeps signing (a second "
                     "signature) for 24 h (SPLATQ_WEBHOOK_ROTATION_OVERLAP_S).",
                     "responses": _secret_responses("the new secret")},
        },
    }  # fmt: skip


def _recover() -> dict[str, Any]:
    answer = schema(Recovered)
    return {
        "operationId": "recoverWebhookEndpoint",
        "description": "Send again the endpoint's failed messages since a time (at most "
        "SPLATQ_WEBHOOK_RECOVER_LIMIT per call); a time in the future is refused (400).",
        "parameters": [_ENDPOINT_ID],
        "requestBody": json_request(RecoverRequest),
        "responses": {**ok("messages queued again", answer, "202"), **_JSON_BODY_ERRORS,
                      **_ENDPOINT_404,
                      "409": problem("endpoint_disabled: enable the endpoint first")},
    }  # fmt: skip


def _test() -> dict[str, Any]:
    answer = schema(SentTestEvent)
    return {
        "operationId": "testWebhookEndpoint",
        "description": f"Send a `{TEST_EVENT}` event to this endpoint through the normal "
        "delivery path (signed, retried, logged in its attempts).",
        "parameters": [_ENDPOINT_ID],
        "responses": {**ok("the event is on its way", answer, "202"), **_ENDPOINT_404,
                      "409": problem("endpoint_disabled: enable the endpoint first")},
    }  # fmt: skip


def _attempts() -> dict[str, Any]:
    return {
        "operationId": "listWebhookEndpointAttempts",
        "description": "The endpoint's delivery attempts, newest first (the newest 1,000 are "
        "kept).",
        "parameters": [
            _ENDPOINT_ID,
            {"name": "limit", "in": "query", "required": False,
             "schema": {"type": "integer", "minimum": 1, "maximum": 100, "default": 20}},
            {"name": "cursor", "in": "query", "required": False,
             "schema": {"type": "string", "pattern": STREAM_ID},
             "description": "the previous page's next_cursor"},
        ],
        "responses": {
            "200": {"description": "a page of attempts",
                    "content": {"application/json": {"schema": ref("DeliveryAttemptPage")}},
                    "headers": {"Link": {"schema": {"type": "string"}}}},
            "400": problem("invalid_request: bad limit or cursor"),
            **_ENDPOINT_404,
        },
    }  # fmt: skip


def endpoint_paths() -> dict[str, Any]:
    listed = schema(EndpointList)
    return {
        "/v1/webhook-endpoints": {
            "post": {
                "operationId": "createWebhookEndpoint",
                "description": "Register an endpoint for the tenant's job events; the answer "
                "carries its own whsec_ secret.",
                "requestBody": json_request(EndpointCreate),
                "responses": {
                    "201": {"description": "created", "content": _ENDPOINT,
                            "headers": {"Location": {"schema": {"type": "string"}},
                                        **NO_STORE_HEADER}},
                    **_JSON_BODY_ERRORS,
                    "401": UNAUTHORIZED,
                    "409": problem("endpoint_limit_reached"),
                    "503": UNAVAILABLE,
                },
            },
            "get": {"operationId": "listWebhookEndpoints",
                    "responses": {**ok("the tenant's endpoints", listed), "401": UNAUTHORIZED,
                                  "503": UNAVAILABLE}},
        },
        "/v1/webhook-endpoints/{endpoint_id}": {
            "get": {"operationId": "getWebhookEndpoint", "parameters": [_ENDPOINT_ID],
                    "responses": {"200": {"description": "the endpoint and its health",
                                          "content": _ENDPOINT}, **_ENDPOINT_404}},
            "patch": {
                "operationId": "updateWebhookEndpoint",
                "description": "Change url, events or enabled; enabling clears the failure "
                "record and closes the circuit.",
                "parameters": [_ENDPOINT_ID],
                "requestBody": json_request(EndpointUpdate),
                "responses": {"200": {"description": "updated", "content": _ENDPOINT},
                              **_JSON_BODY_ERRORS, **_ENDPOINT_404},
            },
            "delete": {"operationId": "deleteWebhookEndpoint", "parameters": [_ENDPOINT_ID],
                       "responses": {"204": {"description": "deleted"}, **_ENDPOINT_404}},
        },
        "/v1/webhook-endpoints/{endpoint_id}/rotate-secret": {
            "post": {"operationId": "rotateWebhookEndpointSecret",
                     "description": "A new secret; the old one keeps signing (a second "
                     "signature) for 24 h (SPLATQ_WEBHOOK_ROTATION_OVERLAP_S).",
                     "parameters": [_ENDPOINT_ID],
                     "responses": {"200": {"description": "the endpoint with its new secret",
                                           "headers": NO_STORE_HEADER, "content": _ENDPOINT},
                                   **_ENDPOINT_404}},
        },
        "/v1/webhook-endpoints/{endpoint_id}/recover": {"post": _recover()},
        "/v1/webhook-endpoints/{endpoint_id}/test": {"post": _test()},
        "/v1/webhook-endpoints/{endpoint_id}/attempts": {"get": _attempts()},
    }  # fmt: skip
