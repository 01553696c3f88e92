"""The OpenAPI paths and schemas of GET /v1/usage and the admin API (`/v1/admin/...`); the
schemas are derived from the shapes (services/gateway/shapes_admin.py, shapes_requests.py)."""

from __future__ import annotations

from typing import Any

from splatq.services.gateway.openapi_common import (
    NO_STORE_HEADER,
    REQUEST_TIMEOUT,
    RETRY_AFTER,
    json_request,
    ok,
    problem,
)
from splatq.services.gateway.shape_schema import components, ref
from splatq.services.gateway.shapes import COMPONENT_NAMES, schema
from splatq.services.gateway.shapes_admin import ApiKey, KeyList, Tenant, TenantPage, Usage
from splatq.services.gateway.shapes_requests import KeyCreate, QuotaSet, TenantCreate, TenantUpdate
from splatq.services.gateway.tenant_listing import CURSOR_PATTERN, DEFAULT_LIMIT, MAX_LIMIT
from splatq.shared.tenants.apikeys import KEY_ID_PATTERN

SCHEMAS: dict[str, Any] = components([Usage, ApiKey, Tenant], COMPONENT_NAMES)


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
_ADMIN: list[dict[str, list[str]]] = [{"adminKey": []}]
BASE = "/v1/admin/tenants"


def tenant_paths() -> dict[str, Any]:
    """GET /v1/usage and the admin API's tenants, keys and quotas."""
    return {**_usage(), **_tenants(), **_keys(), **_quota()}


def _usage() -> dict[str, Any]:
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
    }


def _tenants() -> dict[str, Any]:
    return {
        BASE: {
            "post": {
                "operationId": "adminCreateTenant",
                "security": _ADMIN,
                "requestBody": json_request(TenantCreate),
                "responses": {**_ok("created", "Tenant", "201"), **_BODY_ERRORS,
                              **_ADMIN_ERRORS, "409": problem("tenant_exists")},
            },
            "get": _list_tenants(),
        },
        BASE + "/{tenant}": {
            "get": {
                "operationId": "adminShowTenant",
                "security": _ADMIN,
                "parameters": [_TENANT],
                "responses": {**_ok("the tenant", "Tenant"), **_ADMIN_ERRORS, **_TENANT_404},
            },
            "patch": {
                "operationId": "adminUpdateTenant",
                "security": _ADMIN,
                "parameters": [_TENANT],
                "requestBody": json_request(TenantUpdate),
                "responses": {**_ok("updated", "Tenant"), **_BODY_ERRORS, **_ADMIN_ERRORS,
                              **_TENANT_404},
            },
        },
    }  # fmt: skip


def _list_tenants() -> dict[str, Any]:
    return {
        "operationId": "adminListTenants",
        "security": _ADMIN,
        "description": "Every tenant the gateway knows, by name: created ones (admin API, "
        "`splatq tenants create`) and those named in SPLATQ_API_KEYS, a page at a time; follow "
        "next_cursor until it is null.",
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
            **ok("a page of tenants", schema(TenantPage), headers=NO_STORE_HEADER),
            "400": problem("invalid_request: bad limit or cursor"),
            **_ADMIN_ERRORS,
        },
    }  # fmt: skip


def _keys() -> dict[str, Any]:
    return {
        BASE + "/{tenant}/keys": {
            "post": {
                "operationId": "adminAddKey",
                "security": _ADMIN,
                "description": "A new API key, shown in this answer only (Redis keeps its "
                "SHA-256). With `rotate`, that key stops working after `grace_seconds` "
                "(default 0), in the same step.",
                "parameters": [_TENANT],
                "requestBody": json_request(KeyCreate),
                "responses": {**_ok("the new key", "ApiKey", "201"), **_BODY_ERRORS,
                              **_ADMIN_ERRORS,
                              "404": problem("not_found: no such tenant, or no such key to "
                                              "rotate")},
            },
            "get": {
                "operationId": "adminListKeys",
                "security": _ADMIN,
                "parameters": [_TENANT],
                "responses": {
                    **ok("the tenant's keys (never the keys themselves)", schema(KeyList)),
                    **_ADMIN_ERRORS, **_TENANT_404,
                },
            },
        },
        BASE + "/{tenant}/keys/{key_id}": {
            "delete": {
                "operationId": "adminRevokeKey",
                "security": _ADMIN,
                "description": "Revoke a key: every gateway refuses it at once.",
                "parameters": [_TENANT, _KEY_ID],
                "responses": {"204": {"description": "revoked"}, **_ADMIN_ERRORS,
                              "404": problem("not_found: no such key")},
            },
        },
    }  # fmt: skip


def _quota() -> dict[str, Any]:
    return {
        BASE + "/{tenant}/quota": {
            "get": {
                "operationId": "adminGetQuota",
                "security": _ADMIN,
                "parameters": [_TENANT],
                "responses": {**_ok("the tenant's usage", "Usage"), **_ADMIN_ERRORS,
                              **_TENANT_404},
            },
            "put": {
                "operationId": "adminSetQuota",
                "security": _ADMIN,
                "parameters": [_TENANT],
                "requestBody": json_request(QuotaSet),
                "responses": {**_ok("the tenant's usage under the new quota", "Usage"),
                              **_BODY_ERRORS, **_ADMIN_ERRORS, **_TENANT_404},
            },
        },
    }  # fmt: skip
