"""The admin API (`/v1/admin/...`, behind SPLATQ_ADMIN_API_KEY): tenants, their API keys
and their GPU quotas, without restarting anything. The same operations as `splatq tenants`,
`splatq keys` and `splatq quota` (which talk to Redis directly).

Bodies are small JSON objects parsed strictly (unknown fields are a 400 naming them). A new
API key is in the answer that creates it and nowhere else; Redis keeps only its SHA-256.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import orjson
from aiohttp import web

from splatq.services.gateway import tenant_listing
from splatq.services.gateway.appkeys import QUOTAS, SETTINGS, TENANTS
from splatq.services.gateway.auth import authenticate_admin
from splatq.services.gateway.endpoints import _check_fields, _json_body
from splatq.services.gateway.problems import ApiError, invalid_request, not_found
from splatq.services.gateway.quota_gate import usage_view
from splatq.services.gateway.server import NO_STORE
from splatq.services.gateway.shape_schema import field_names
from splatq.services.gateway.shapes_requests import (
    MAX_CAP,
    MAX_GRACE_S,
    MAX_QUOTA_SECONDS,
    KeyCreate,
    QuotaSet,
    TenantCreate,
    TenantUpdate,
)
from splatq.services.gateway.views import rfc3339
from splatq.shared.engine.keys import StreamName
from splatq.shared.tenants.apikeys import KEY_ID_PATTERN
from splatq.shared.tenants.periods import Period
from splatq.shared.tenants.store import (
    MAX_WEIGHT,
    KeyInfo,
    TenantError,
    TenantScheduling,
    TenantStore,
)

# The members each body may have: the shapes the OpenAPI document states (shapes_requests).
CREATE_FIELDS = field_names(TenantCreate)
UPDATE_FIELDS = field_names(TenantUpdate)
KEY_FIELDS = field_names(KeyCreate)
QUOTA_FIELDS = field_names(QuotaSet)
KEY_ID_RE = re.compile(KEY_ID_PATTERN)


def add_admin_routes(app: web.Application) -> None:
    base = "/v1/admin/tenants"
    app.router.add_post(base, create_tenant)
    app.router.add_get(base, list_tenants)
    app.router.add_get(base + "/{tenant}", show_tenant)
    app.router.add_patch(base + "/{tenant}", update_tenant)
    app.router.add_post(base + "/{tenant}/keys", add_key)
    app.router.add_get(base + "/{tenant}/keys", list_keys)
    app.router.add_delete(base + "/{tenant}/keys/{key_id}", revoke_key)
    app.router.add_get(base + "/{tenant}/quota", get_quota)
    app.router.add_put(base + "/{tenant}/quota", set_quota)


def _json(body: object, status: int = 200) -> web.Response:
    """Every admin answer is `no-store`: a new key is in one, key hints and quotas in others."""
    return web.Response(
        status=status,
        body=orjson.dumps(body),
        content_type="application/json",
        headers=NO_STORE,
    )


def _tenant_error(exc: TenantError) -> ApiError:
    status = {"not_found": 404, "tenant_exists": 409}.get(exc.code, 400)
    return ApiError(status, exc.code, exc.message)


async def _admin(request: web.Request) -> TenantStore:
    await authenticate_admin(request, request.app[SETTINGS].admin_api_key)
    return request.app[TENANTS]


async def _known_tenant(request: web.Request, store: TenantStore) -> str:
    """The URL's tenant if it exists (created in Redis, or named in SPLATQ_API_KEYS)."""
    tenant = request.match_info["tenant"]
    if tenant in request.app[SETTINGS].api_keys.values() or await store.exists(tenant):
        return tenant
    raise not_found("tenant")


def _int_field(doc: Mapping[str, Any], name: str, lo: int, hi: int) -> int:
    """An integer member; an integral float (`2.0`) is one too, as JSON Schema reads it."""
    value = doc[name]
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise invalid_request(f"{name} must be an integer within [{lo}, {hi}]")
    return value


def _caps(doc: Mapping[str, Any]) -> dict[StreamName, int]:
    raw = doc.get("running_caps", {})
    if not isinstance(raw, dict):
        raise invalid_request("running_caps must be an object {interactive, synthesis}")
    names = {s.value for s in StreamName}
    unknown = sorted(set(raw) - names)
    if unknown:
        raise invalid_request(f"running_caps has unknown class {unknown[0]!r}")
    return {StreamName(k): _int_field(raw, k, 0, MAX_CAP) for k in raw}


def _scheduling_view(s: TenantScheduling) -> dict[str, Any]:
    return {
        "weight": s.weight,
        "running_caps": {st.value: s.running_cap(st) for st in StreamName},
    }


def _key_view(k: KeyInfo) -> dict[str, Any]:
    return {
        "key_id": k.key_id,
        "label": k.label,
        "hint": k.hint,
        "created_at": rfc3339(k.created_ms),
        "expires_at": rfc3339(k.expires_ms),
    }


async def _tenant_view(request: web.Request, store: TenantStore, tenant: str) -> dict[str, Any]:
    created = (await store.all()).get(tenant)
    return {
        "tenant": tenant,
        "created_at": rfc3339(created),
        **_scheduling_view(await store.scheduling(tenant)),
        "quota": usage_view(await request.app[QUOTAS].usage(tenant)),
        "keys": [_key_view(k) for k in await store.list_keys(tenant)],
    }


async def create_tenant(request: web.Request) -> web.Response:
    store = await _admin(request)
    doc = await _json_body(request)
    _check_fields(doc, CREATE_FIELDS)
    tenant = doc.get("tenant")
    if not isinstance(tenant, str):
        raise invalid_request("tenant (a string) is required")
    weight = _int_field(doc, "weight", 1, MAX_WEIGHT) if "weight" in doc else 1
    try:
        await store.create(tenant, weight, _caps(doc))
    except TenantError as exc:
        raise _tenant_error(exc) from None
    return _json(await _tenant_view(request, store, tenant), 201)


async def list_tenants(request: web.Request) -> web.Response:
    """Created and configured tenants by name, a page at a time (tenant_listing)."""
    store = await _admin(request)
    query = tenant_listing.parse_query(request.query)
    configured = set(request.app[SETTINGS].api_keys.values())
    rows, cursor = tenant_listing.page(await store.all(), configured, query)
    base = request.app[SETTINGS].public_base_url
    url = tenant_listing.next_url(base, request.path, query, cursor)
    return _json({"tenants": tenant_listing.view(rows), "next_cursor": cursor, "next": url})


async def show_tenant(request: web.Request) -> web.Response:
    store = await _admin(request)
    tenant = await _known_tenant(request, store)
    return _json(await _tenant_view(request, store, tenant))


async def update_tenant(request: web.Request) -> web.Response:
    store = await _admin(request)
    tenant = await _known_tenant(request, store)
    doc = await _json_body(request)
    _check_fields(doc, UPDATE_FIELDS)
    weight = _int_field(doc, "weight", 1, MAX_WEIGHT) if "weight" in doc else None
    await store.update(tenant, weight=weight, caps=_caps(doc))
    return _json(await _tenant_view(request, store, tenant))


async def add_key(request: web.Request) -> web.Response:
    """A new API key (in this answer only). With `rotate`, that key of the tenant stops
    working after `grace_seconds` (default 0: at once), in the same step."""
    store = await _admin(request)
    tenant = request.match_info["tenant"]
    doc = await _json_body(request)
    _check_fields(doc, KEY_FIELDS)
    label = doc.get("label", "")
    rotate = doc.get("rotate", "")
    if not isinstance(label, str) or not isinstance(rotate, str):
        raise invalid_request("label and rotate must be strings")
    if "rotate" in doc and not KEY_ID_RE.fullmatch(rotate):
        raise invalid_request("rotate must be a key id (key_ and 26 characters)")
    grace = _int_field(doc, "grace_seconds", 0, MAX_GRACE_S) if "grace_seconds" in doc else 0
    try:
        new = await store.add_key(tenant, label, retire=rotate, retire_after_s=grace)
    except TenantError as exc:
        raise _tenant_error(exc) from None
    body = {**_key_view(new.info), "api_key": new.api_key}
    if rotate:
        body["retired_key_id"] = rotate
    return _json(body, 201)


async def list_keys(request: web.Request) -> web.Response:
    store = await _admin(request)
    tenant = await _known_tenant(request, store)
    return _json({"keys": [_key_view(k) for k in await store.list_keys(tenant)]})


async def revoke_key(request: web.Request) -> web.Response:
    store = await _admin(request)
    try:
        await store.revoke_key(request.match_info["tenant"], request.match_info["key_id"])
    except TenantError as exc:
        raise _tenant_error(exc) from None
    return web.Response(status=204)


async def get_quota(request: web.Request) -> web.Response:
    store = await _admin(request)
    tenant = await _known_tenant(request, store)
    return _json(usage_view(await request.app[QUOTAS].usage(tenant)))


async def set_quota(request: web.Request) -> web.Response:
    store = await _admin(request)
    tenant = await _known_tenant(request, store)
    doc = await _json_body(request)
    _check_fields(doc, QUOTA_FIELDS)
    if "gpu_seconds" not in doc:
        raise invalid_request("gpu_seconds is required (a number of GPU-seconds, or null)")
    seconds = doc["gpu_seconds"]
    if seconds is not None and (
        not isinstance(seconds, int | float)
        or isinstance(seconds, bool)
        or not 0 <= seconds < MAX_QUOTA_SECONDS
    ):
        raise invalid_request("gpu_seconds must be a number >= 0, or null for no quota")
    try:
        period = Period(doc.get("period", "month"))
    except ValueError:
        raise invalid_request("period must be 'day' or 'month'") from None
    await store.set_quota(tenant, seconds, period)
    return _json(usage_view(await request.app[QUOTAS].usage(tenant)))
