"""The OpenAPI paths and schemas of GET /v1/usage and the admin API (`/v1/admin/...`)."""

from __future__ import annotations

from typing import Any

from splatq.services.gateway.openapi_common import (
    NO_STORE_HEADER,
    REQUEST_TIMEOUT,
    RETRY_AFTER,
    TIME_OR_NULL,
    json_request,
    ok,
    problem,
    ref,
)
from splatq.services.gateway.tenant_listing import CURSOR_PATTERN, DEFAULT_LIMIT, MAX_LIMIT
from splatq.shared.tenants.apikeys import KEY_ID_PATTERN

_TIME_OR_NULL = TIME_OR_NULL
_SECONDS_OR_NULL = {"type": ["number", "null"], "minimum": 0}
_CAP = {"type": "integer", "minimum": 0, "maximum": 1_000_000}
_WEIGHT = {"type": "integer", "minimum": 1, "maximum": 1000}

USAGE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["tenant", "period", "quota_gpu_seconds", "reserved_gpu_seconds",
                 "used_gpu_seconds", "resets_at"],
    "properties": {
        "tenant": {"type": "string"},
        "period": {"type": "string", "enum": ["day", "month"]},
        "period_id": {"type": "string"},
        "quota_gpu_seconds": {**_SECONDS_OR_NULL, "description": "null: no quota"},
        "reserved_gpu_seconds": {"type": "number", "minimum": 0,
                                 "description": "held by jobs not finished yet (estimates)"},
        "used_gpu_seconds": {"type": "number", "minimum": 0,
                             "description": "measured GPU time of completed jobs"},
        "remaining_gpu_seconds": _SECONDS_OR_NULL,
        "resets_at": {"type": "string", "format": "date-time",
                      "description": "start of the next period (UTC)"},
    },
}  # fmt: skip

_KEY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["key_id", "label", "hint", "created_at", "expires_at"],
    "properties": {
        "key_id": {"type": "string", "pattern": "^key_[0-9A-Z]{26}$"},
        "label": {"type": "string"},
        "hint": {"type": "string", "description": "prefix and last 4 characters"},
        "created_at": {"type": "string", "format": "date-time"},
        "expires_at": {**_TIME_OR_NULL, "description": "set on a key retired by a rotation"},
        "api_key": {"type": "string", "description": "only in the answer that creates it"},
        "retired_key_id": {"type": "string"},
    },
}
_CAPS = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"interactive": _CAP, "synthesis": _CAP},
    "description": "running jobs per class, across all workers (0 = no cap of its own)",
}
_TENANT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["tenant", "weight", "running_caps", "quota", "keys"],
    "properties": {
        "tenant": {"type": "string"},
        "created_at": _TIME_OR_NULL,
        "weight": _WEIGHT,
        "running_caps": _CAPS,
        "quota": {"$ref": "#/components/schemas/Usage"},
        "keys": {"type": "array", "items": {"$ref": "#/components/schemas/ApiKey"}},
    },
}

SCHEMAS: dict[str, Any] = {
    "Usage": USAGE_SCHEMA,
    "ApiKey": _KEY_SCHEMA,
    "Tenant": _TENANT_SCHEMA,
}


def _ok(description: str, name: str, status: str = "200") -> dict[str, Any]:
    return ok(description, ref(name), status, headers=NO_STORE_HEADER)


_ADMIN_ERRORS = {
    "401": problem("unauthorized: no API key, or an unknown one"),
    "403": problem("forbidden (a tenant's key, not the admin key) or admin_disabled (no "
                    "SPLATQ_ADMIN_API_KEY)"),
    "429": problem("too_many_auth_failures: this client address, or every client together, "
                   "failed to authenticate too often (SPLATQ_ADMIN_AUTH_FAILURES_PER_MIN, "
                   "_GLOBAL_PER_MIN); no key is checked until Retry-After", RETRY_AFTER),
    "503": problem("unavailable: Redis unreachable", RETRY_AFTER),
}  # fmt: skip
_BODY_ERRORS = {
    "400": problem("invalid_request: bad JSON, an unknown field, a value out of range"),
    "408": REQUEST_TIMEOUT,
    "413": problem("payload_too_large: the body exceeds 16 KB"),
    "415": problem("unsupported_media_type: the body must be application/json"),
}
_TENANT_404 = {"404": problem("not_found: no such tenant")}
_TENANT = {"name": "tenant", "in": "path", "required": True,
           "schema": {"type": "string", "maxLength": 64}}  # fmt: skip
_KEY_ID = {"name": "key_id", "in": "path", "required": True,
           "schema": {"type": "string", "maxLength": 64},
           "description": f"a key id ({KEY_ID_PATTERN}); any other: 404"}  # fmt: skip
_TENANT_PAGE: dict[str, Any] = {
    "type": "object",
    "required": ["tenants", "next_cursor", "next"],
    "properties": {
        "tenants": {"type": "array", "items": {
            "type": "object", "required": ["tenant", "created_at", "configured"],
            "properties": {"tenant": {"type": "string"},
                           "created_at": {**TIME_OR_NULL,
                                          "description": "null: only in SPLATQ_API_KEYS"},
                           "configured": {"type": "boolean",
                                          "description": "named in SPLATQ_API_KEYS"}}}},
        "next_cursor": {"type": ["string", "null"]},
        "next": {"type": ["string", "null"], "description": "the next page's URL"},
    },
}  # fmt: skip


def tenant_paths() -> dict[str, Any]:
    admin: list[dict[str, list[str]]] = [{"adminKey": []}]
    base = "/v1/admin/tenants"
    return {
        "/v1/usage": {
            "get": {
                "operationId": "getUsage",
                "description": "The calling tenant's GPU quota in the current period: quota, "
                "reserved (estimates of unfinished jobs), used (measured) and reset time.",
                "responses": {
                    **_ok("the tenant's usage", "Usage"),
                    "401": problem("missing or unknown API key"),
                    "503": problem("unavailable", RETRY_AFTER),
                },
            }
        },
        base: {
            "post": {
                "operationId": "adminCreateTenant",
                "security": admin,
                "requestBody": json_request({
                    "type": "object", "required": ["tenant"], "additionalProperties": False,
                    "properties": {"tenant": {"type": "string",
                                              "pattern": "^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"},
                                   "weight": _WEIGHT, "running_caps": _CAPS},
                }),
                "responses": {**_ok("created", "Tenant", "201"), **_BODY_ERRORS,
                              **_ADMIN_ERRORS, "409": problem("tenant_exists")},
            },
            "get": {
                "operationId": "adminListTenants",
                "security": admin,
                "description": "Every tenant the gateway knows, by name: created ones (admin "
                "API, `splatq tenants create`) and those named in SPLATQ_API_KEYS, a page at a "
                "time; follow next_cursor until it is null.",
                "parameters": [
                    {"name": "limit", "in": "query", "required": False,
                     "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT,
                                "default": DEFAULT_LIMIT}},
                    {"name": "cursor", "in": "query", "required": False,
                     "schema": {"type": "string", "minLength": 1, "maxLength": 512,
                                "pattern": CURSOR_PATTERN},
                     "description": "the previous page's next_cursor (another value: 400)"},
                ],
                "responses": {
                    **ok("a page of tenants", _TENANT_PAGE, headers=NO_STORE_HEADER),
                    "400": problem("invalid_request: bad limit or cursor"),
                    **_ADMIN_ERRORS,
                },
            },
        },
        base + "/{tenant}": {
            "get": {
                "operationId": "adminShowTenant",
                "security": admin,
                "parameters": [_TENANT],
                "responses": {**_ok("the tenant", "Tenant"), **_ADMIN_ERRORS, **_TENANT_404},
            },
            "patch": {
                "operationId": "adminUpdateTenant",
                "security": admin,
                "parameters": [_TENANT],
                "requestBody": json_request({
                    "type": "object", "additionalProperties": False,
                    "properties": {"weight": _WEIGHT, "running_caps": _CAPS},
                }),
                "responses": {**_ok("updated", "Tenant"), **_BODY_ERRORS, **_ADMIN_ERRORS,
                              **_TENANT_404},
            },
        },
        base + "/{tenant}/keys": {
            "post": {
                "operationId": "adminAddKey",
                "security": admin,
                "description": "A new API key, shown in this answer only (Redis keeps its "
                "SHA-256). With `rotate`, that key stops working after `grace_seconds` "
                "(default 0), in the same step.",
                "parameters": [_TENANT],
                "requestBody": json_request({
                    "type": "object", "additionalProperties": False,
                    "properties": {"label": {"type": "string", "maxLength": 100,
                                            "description": "printable text (no control, "
                                            "format or unassigned characters), else 400"},
                                   "rotate": {"type": "string", "pattern": f"^{KEY_ID_PATTERN}$",
                                              "description": "the key id to retire"},
                                   "grace_seconds": {"type": "integer", "minimum": 0,
                                                     "maximum": 2592000}},
                }),
                "responses": {**_ok("the new key", "ApiKey", "201"), **_BODY_ERRORS,
                              **_ADMIN_ERRORS,
                              "404": problem("not_found: no such tenant, or no such key to "
                                              "rotate")},
            },
            "get": {
                "operationId": "adminListKeys",
                "security": admin,
                "parameters": [_TENANT],
                "responses": {
                    "200": {"description": "the tenant's keys (never the keys themselves)",
                            "content": {"application/json": {"schema": {
                                "type": "object", "required": ["keys"],
                                "properties": {"keys": {"type": "array", "items": {
                                    "$ref": "#/components/schemas/ApiKey"}}}}}}},
                    **_ADMIN_ERRORS, **_TENANT_404,
                },
            },
        },
        base + "/{tenant}/keys/{key_id}": {
            "delete": {
                "operationId": "adminRevokeKey",
                "security": admin,
                "description": "Revoke a key: every gateway refuses it at once.",
                "parameters": [_TENANT, _KEY_ID],
                "responses": {"204": {"description": "revoked"}, **_ADMIN_ERRORS,
                              "404": problem("not_found: no such key")},
            },
        },
        base + "/{tenant}/quota": {
            "get": {
                "operationId": "adminGetQuota",
                "security": admin,
                "parameters": [_TENANT],
                "responses": {**_ok("the tenant's usage", "Usage"), **_ADMIN_ERRORS,
                              **_TENANT_404},
            },
            "put": {
                "operationId": "adminSetQuota",
                "security": admin,
                "parameters": [_TENANT],
                "requestBody": json_request({
                    "type": "object", "required": ["gpu_seconds"], "additionalProperties": False,
                    "properties": {"gpu_seconds": {"type": ["number", "null"], "minimum": 0,
                                                   "exclusiveMaximum": 1e12},
                                   "period": {"type": "string", "enum": ["day", "month"],
                                              "default": "month"}},
                }),
                "responses": {**_ok("the tenant's usage under the new quota", "Usage"),
                              **_BODY_ERRORS, **_ADMIN_ERRORS, **_TENANT_404},
            },
        },
    }  # fmt: skip
