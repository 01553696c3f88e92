"""The OpenAPI paths and schemas of remote model backends and the result cache: the job view's
`upstream` object, the admin cache endpoints and the vendor's webhook."""

from __future__ import annotations

from typing import Any

from splatq.services.gateway.openapi_common import (
    NO_STORE_HEADER,
    REQUEST_TIMEOUT,
    json_request,
    ok,
    problem,
    ref,
)
from splatq.services.gateway.openapi_tenants import _ADMIN_ERRORS, _BODY_ERRORS

UPSTREAM_SCHEMA: dict[str, Any] = {
    "type": ["object", "null"],
    "description": "A hosted model's call (SPLATQ_MODEL=remote); null for a local model.",
    "required": ["vendor", "request_id", "latency_ms"],
    "properties": {
        "vendor": {"type": "string"},
        "request_id": {"type": ["string", "null"],
                       "description": "the vendor's request id (else its prediction id)"},
        "latency_ms": {"type": ["integer", "null"],
                       "description": "upstream latency: the prediction's creation to its end"},
        "prediction_id": {"type": ["string", "null"]},
    },
}  # fmt: skip
CACHE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["version", "generation", "soft_ttl_s", "hard_ttl_s"],
    "properties": {
        "version": {"type": "string", "description": "the model/backend version"},
        "generation": {"type": "integer", "minimum": 0,
                       "description": "purges of this version so far"},
        "soft_ttl_s": {"type": "integer", "minimum": 0},
        "hard_ttl_s": {"type": "integer", "minimum": 1},
    },
}  # fmt: skip
SCHEMAS: dict[str, Any] = {"Upstream": UPSTREAM_SCHEMA, "CacheInfo": CACHE_SCHEMA}
OPERATIONS: dict[str, tuple[str, str]] = {
    "adminCacheInfo": ("Admin", "Get the result cache's version, generation and TTLs"),
    "adminPurgeCache": ("Admin", "Purge the cached results of a model/backend version"),
    "vendorWebhook": ("Operations", "Receive a hosted model vendor's webhook"),
}


_PURGE_BODY = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"version": {"type": "string", "minLength": 1, "maxLength": 300}},
}
_VENDOR = {"name": "vendor", "in": "path", "required": True,
           "schema": {"type": "string", "maxLength": 64}}  # fmt: skip


def upstream_paths() -> dict[str, Any]:
    cache = ok("the cache", ref("CacheInfo"), headers=NO_STORE_HEADER)
    return {
        "/v1/admin/cache": {
            "get": {
                "operationId": "adminCacheInfo",
                "security": [{"adminKey": []}],
                "responses": {**cache, **_ADMIN_ERRORS},
            },
        },
        "/v1/admin/cache/purge": {
            "post": {
                "operationId": "adminPurgeCache",
                "security": [{"adminKey": []}],
                "description": "Every cached result of the version (default: the current one) "
                "becomes a miss, within a second on every gateway.",
                "requestBody": json_request(_PURGE_BODY),
                "responses": {**cache, **_BODY_ERRORS, **_ADMIN_ERRORS},
            },
        },
        "/v1/vendor-webhooks/{vendor}": {
            "post": {
                "operationId": "vendorWebhook",
                "security": [],
                "description": "Where a hosted model's vendor reports a finished prediction "
                "(webhook.enabled in SPLATQ_REMOTE_CONFIG); verified by its Standard Webhooks "
                "signature.",
                "parameters": [_VENDOR],
                "requestBody": json_request({"type": "object"}),
                "responses": {
                    "204": {"description": "accepted"},
                    "400": problem("invalid_request: not a prediction of the configured shape"),
                    "401": problem("invalid_signature: the signature does not verify"),
                    "404": problem("not_found: no webhook of this vendor is configured"),
                    "408": REQUEST_TIMEOUT,
                    "413": problem("payload_too_large: the body exceeds 1 MB"),
                },
            },
        },
    }
