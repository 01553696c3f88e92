"""The OpenAPI paths and schemas of remote model backends and the result cache: the job view's
`upstream` object, the admin cache endpoints and the vendor's webhook. The schemas are
derived from the shapes (services/gateway/shapes.py, shapes_admin.py, shapes_requests.py)."""

from __future__ import annotations

from typing import Any

from splatq.services.gateway.openapi_common import (
    NO_STORE_HEADER,
    REQUEST_TIMEOUT,
    json_request,
    ok,
    problem,
)
from splatq.services.gateway.openapi_tenants import _ADMIN_ERRORS, _BODY_ERRORS
from splatq.services.gateway.shape_schema import components, ref
from splatq.services.gateway.shapes import COMPONENT_NAMES, Upstream
from splatq.services.gateway.shapes_admin import CacheInfo
from splatq.services.gateway.shapes_requests import CachePurge

SCHEMAS: dict[str, Any] = components([Upstream, CacheInfo], COMPONENT_NAMES)
OPERATIONS: dict[str, tuple[str, str]] = {
    "adminCacheInfo": ("Admin", "Get the result cache's version, generation and TTLs"),
    "adminPurgeCache": ("Admin", "Purge the cached results of a model/backend version"),
    "vendorWebhook": ("Operations", "Receive a hosted model vendor's webhook"),
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
                "requestBody": json_request(CachePurge),
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
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": {"type": "object"}}},
                },
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
