"""Webhook endpoint management: register, list, show, change, delete, rotate the secret,
recover failed messages, send a test event, read the attempt log. Every endpoint belongs to
one tenant; another tenant's id is 404.

Request bodies are small JSON objects, parsed strictly (unknown fields are a 400 naming them).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import orjson
from aiohttp import web

from splatq.services.gateway.appkeys import QUEUE, SETTINGS
from splatq.services.gateway.auth import authenticate
from splatq.services.gateway.digits import is_digits
from splatq.services.gateway.problems import ApiError, invalid_request, not_found
from splatq.services.gateway.server import NO_STORE
from splatq.services.gateway.shape_schema import field_names
from splatq.services.gateway.shapes_requests import EndpointCreate, EndpointUpdate, RecoverRequest
from splatq.services.gateway.submission import check_webhook_url, read_capped
from splatq.services.gateway.views import rfc3339, valid_stream_id
from splatq.shared.engine.events import EventType
from splatq.shared.webhooks.endpoints import Endpoint, EndpointLimitReached, EndpointStore
from splatq.shared.webhooks.headers import HeadersRejected, validate_headers
from splatq.shared.webhooks.store import TEST_EVENT, WebhookStore

MAX_BODY_BYTES = 16 * 1024
EVENT_NAMES = frozenset(e.value for e in EventType)
# The members each body may have: the shapes the OpenAPI document states (shapes_requests).
CREATE_FIELDS = field_names(EndpointCreate)
UPDATE_FIELDS = field_names(EndpointUpdate)
RECOVER_FIELDS = field_names(RecoverRequest)
DEFAULT_ATTEMPTS_LIMIT = 20
MAX_ATTEMPTS_LIMIT = 100


def add_endpoint_routes(app: web.Application) -> None:
    base = "/v1/webhook-endpoints"
    app.router.add_post(base, create_endpoint)
    app.router.add_get(base, list_endpoints)
    app.router.add_get(base + "/{endpoint_id}", get_endpoint)
    app.router.add_patch(base + "/{endpoint_id}", update_endpoint)
    app.router.add_delete(base + "/{endpoint_id}", delete_endpoint)
    app.router.add_post(base + "/{endpoint_id}/rotate-secret", rotate_secret)
    app.router.add_post(base + "/{endpoint_id}/recover", recover)
    app.router.add_post(base + "/{endpoint_id}/test", send_test)
    app.router.add_get(base + "/{endpoint_id}/attempts", list_attempts)


# -- views and parsing (pure) -----------------------------------------------------------------


def endpoint_view(e: Endpoint, base_url: str, now_ms: int) -> dict[str, Any]:
    rotating = bool(e.previous_secret) and e.previous_expires_ms > now_ms
    return {
        "id": e.id,
        "url": e.url,
        "events": list(e.events),
        "enabled": e.enabled,
        "headers": dict(e.headers),
        "created_at": rfc3339(e.created_ms),
        "disabled_at": rfc3339(e.disabled_at_ms),
        "disabled_reason": e.disabled_reason or None,
        "health": {
            "circuit": e.circuit,
            "open_until": rfc3339(e.open_until_ms) if e.circuit != "closed" else None,
            "consecutive_failures": e.consecutive_failures,
            "failing_since": rfc3339(e.failing_since_ms),
            "last_success_at": rfc3339(e.last_success_ms),
            "last_failure_at": rfc3339(e.last_failure_ms),
        },
        "previous_secret_expires_at": rfc3339(e.previous_expires_ms) if rotating else None,
        "urls": {"self": f"{base_url}/v1/webhook-endpoints/{e.id}"},
    }


def parse_events(raw: Any) -> tuple[str, ...]:
    """A list of event names (an empty list subscribes to every event)."""
    if not isinstance(raw, list) or not all(isinstance(e, str) for e in raw):
        raise invalid_request("events must be a list of event names")
    bad = [e for e in raw if e not in EVENT_NAMES]
    if bad:
        raise invalid_request(f"events has unknown event {bad[0]!r} (known: {sorted(EVENT_NAMES)})")
    return tuple(dict.fromkeys(raw))


def parse_since(raw: Any, now_ms: int) -> int:
    """An RFC 3339 time in the past, as epoch milliseconds."""
    if not isinstance(raw, str):
        raise invalid_request("since must be an RFC 3339 time, e.g. 2026-11-29T12:00:00Z")
    try:
        moment = datetime.fromisoformat(raw.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise invalid_request(f"since is not an RFC 3339 time: {raw!r}") from None
    if moment.tzinfo is None:
        raise invalid_request("since must carry a time zone (Z or ±hh:mm)")
    since_ms = int(moment.timestamp() * 1000)
    if since_ms > now_ms:
        raise invalid_request("since is in the future")
    return max(since_ms, 0)


def parse_headers(raw: Any) -> dict[str, str]:
    try:
        return validate_headers(raw)
    except HeadersRejected as exc:
        raise invalid_request(str(exc)) from None


def _check_fields(doc: dict[str, Any], allowed: frozenset[str]) -> None:
    unknown = sorted(set(doc) - allowed)
    if unknown:
        raise invalid_request(f"unknown field {unknown[0]!r} (allowed: {sorted(allowed)})")


# -- handlers ---------------------------------------------------------------------------------


async def _json_body(request: web.Request) -> dict[str, Any]:
    if request.content_type != "application/json":
        raise ApiError(
            415,
            "unsupported_media_type",
            f"Content-Type must be application/json, got {request.content_type!r}",
        )
    declared = request.content_length
    if declared is not None and declared > MAX_BODY_BYTES:
        raise ApiError(413, "payload_too_large", f"the body exceeds {MAX_BODY_BYTES} bytes")
    body = await read_capped(request, MAX_BODY_BYTES, request.app[SETTINGS].body_timeout_s)
    try:
        doc = orjson.loads(body) if body else {}
    except orjson.JSONDecodeError as exc:
        raise invalid_request(f"body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise invalid_request("body must be a JSON object")
    return doc


def _store(request: web.Request) -> EndpointStore:
    return EndpointStore(request.app[QUEUE])


def _respond(
    request: web.Request,
    endpoint: Endpoint,
    status: int = 200,
    with_secret: bool = False,
    headers: dict[str, str] | None = None,
) -> web.Response:
    now_ms = int(time.time() * 1000)
    body = endpoint_view(endpoint, request.app[SETTINGS].public_base_url, now_ms)
    if with_secret:
        body["secret"] = endpoint.secret
        headers = {**(headers or {}), **NO_STORE}
    return web.Response(
        status=status, body=orjson.dumps(body), content_type="application/json", headers=headers
    )


async def _owned(request: web.Request, tenant: str) -> Endpoint:
    endpoint = await _store(request).get(tenant, request.match_info["endpoint_id"])
    if endpoint is None:
        raise not_found("webhook endpoint")
    return endpoint


async def create_endpoint(request: web.Request) -> web.Response:
    """Register an endpoint; the answer carries its signing secret (shown here and after a
    rotation only)."""
    settings = request.app[SETTINGS]
    tenant = await authenticate(request)
    doc = await _json_body(request)
    _check_fields(doc, CREATE_FIELDS)
    if "url" not in doc:
        raise invalid_request("url is required")
    url = check_webhook_url(doc["url"], settings.webhook_allow_private, field="url")
    events: Sequence[str] = parse_events(doc.get("events", []))
    headers = parse_headers(doc.get("headers"))
    try:
        endpoint = await _store(request).create(tenant, url, events, headers)
    except EndpointLimitReached as exc:
        raise ApiError(409, "endpoint_limit_reached", str(exc)) from None
    location = f"{settings.public_base_url}/v1/webhook-endpoints/{endpoint.id}"
    return _respond(request, endpoint, 201, with_secret=True, headers={"Location": location})


async def list_endpoints(request: web.Request) -> web.Response:
    tenant = await authenticate(request)
    base_url = request.app[SETTINGS].public_base_url
    now_ms = int(time.time() * 1000)
    endpoints = await _store(request).of_tenant(tenant)
    body = {"data": [endpoint_view(e, base_url, now_ms) for e in endpoints]}
    return web.Response(body=orjson.dumps(body), content_type="application/json")


async def get_endpoint(request: web.Request) -> web.Response:
    tenant = await authenticate(request)
    return _respond(request, await _owned(request, tenant))


async def update_endpoint(request: web.Request) -> web.Response:
    """Change url, events or enabled. Enabling clears the endpoint's failure record."""
    settings = request.app[SETTINGS]
    tenant = await authenticate(request)
    doc = await _json_body(request)
    _check_fields(doc, UPDATE_FIELDS)
    url = None
    if "url" in doc:
        url = check_webhook_url(doc["url"], settings.webhook_allow_private, field="url")
    events = parse_events(doc["events"]) if "events" in doc else None
    enabled = doc.get("enabled")
    if enabled is not None and not isinstance(enabled, bool):
        raise invalid_request("enabled must be true or false")
    headers = parse_headers(doc["headers"]) if "headers" in doc else None
    updated = await _store(request).update(
        tenant,
        request.match_info["endpoint_id"],
        url=url,
        events=events,
        enabled=enabled,
        headers=headers,
    )
    if updated is None:
        raise not_found("webhook endpoint")
    return _respond(request, updated)


async def delete_endpoint(request: web.Request) -> web.Response:
    """Remove the endpoint; its pending messages are dropped, nothing more is sent to it."""
    tenant = await authenticate(request)
    if not await _store(request).delete(tenant, request.match_info["endpoint_id"]):
        raise not_found("webhook endpoint")
    return web.Response(status=204)


async def rotate_secret(request: web.Request) -> web.Response:
    """A new secret; deliveries carry signatures with both secrets for the overlap period."""
    tenant = await authenticate(request)
    rotated = await _store(request).rotate_secret(tenant, request.match_info["endpoint_id"])
    if rotated is None:
        raise not_found("webhook endpoint")
    return _respond(request, rotated, with_secret=True)


async def recover(request: web.Request) -> web.Response:
    """Send again the endpoint's failed (dead-lettered) messages since a time."""
    settings = request.app[SETTINGS]
    tenant = await authenticate(request)
    endpoint = await _owned(request, tenant)
    doc = await _json_body(request)
    _check_fields(doc, RECOVER_FIELDS)
    if "since" not in doc:
        raise invalid_request("since is required (RFC 3339)")
    since_ms = parse_since(doc["since"], int(time.time() * 1000))
    if not endpoint.enabled:
        raise ApiError(
            409,
            "endpoint_disabled",
            'the endpoint is disabled; enable it first (PATCH with {"enabled": true})',
        )
    result = await _store(request).recover(tenant, endpoint.id, since_ms)
    body = {
        "endpoint_id": endpoint.id,
        "since": rfc3339(since_ms) if since_ms else "1970-01-01T00:00:00.000Z",
        "recovered": result.recovered,
        "expired": result.expired,
        "truncated": result.truncated,
        "limit": settings.webhook_recover_limit,
    }
    return web.Response(status=202, body=orjson.dumps(body), content_type="application/json")


async def send_test(request: web.Request) -> web.Response:
    """Send a `webhook.test` event to this endpoint through the normal delivery path (outbox,
    fan-out, signed delivery, retries, attempt log); 202 with its event id."""
    tenant = await authenticate(request)
    endpoint = await _owned(request, tenant)
    if not endpoint.enabled:
        raise ApiError(
            409,
            "endpoint_disabled",
            'the endpoint is disabled; enable it first (PATCH with {"enabled": true})',
        )
    event_id = await WebhookStore(request.app[QUEUE]).send_test_event(tenant, endpoint.id)
    base = request.app[SETTINGS].public_base_url
    body = {
        "endpoint_id": endpoint.id,
        "event": TEST_EVENT,
        "event_id": event_id,
        "attempts_url": f"{base}/v1/webhook-endpoints/{endpoint.id}/attempts",
    }
    return web.Response(status=202, body=orjson.dumps(body), content_type="application/json")


async def list_attempts(request: web.Request) -> web.Response:
    """The endpoint's delivery attempts, newest first, paged by `cursor` (`limit` 1-100);
    the newest ATTEMPT_LOG_CAP are kept, for the record retention."""
    settings = request.app[SETTINGS]
    tenant = await authenticate(request)
    endpoint = await _owned(request, tenant)
    unknown = sorted(set(request.query) - {"limit", "cursor"})
    if unknown:
        raise invalid_request(f"unknown query parameter {unknown[0]!r}")
    raw_limit = request.query.get("limit", str(DEFAULT_ATTEMPTS_LIMIT))
    if not is_digits(raw_limit) or not 1 <= int(raw_limit) <= MAX_ATTEMPTS_LIMIT:
        raise invalid_request(f"limit must be an integer within [1, {MAX_ATTEMPTS_LIMIT}]")
    cursor = request.query.get("cursor")  # sent but empty is no cursor either: 400
    if cursor is not None and not valid_stream_id(cursor):
        raise invalid_request("cursor is not a cursor this API returned")
    rows, more = await _store(request).attempts(tenant, endpoint.id, cursor, int(raw_limit))
    next_cursor = rows[-1][0] if more and rows else None
    base = f"{settings.public_base_url}/v1/webhook-endpoints/{endpoint.id}/attempts"
    next_url = f"{base}?limit={raw_limit}&cursor={next_cursor}" if next_cursor else None
    body = {
        "endpoint_id": endpoint.id,
        "items": [record for _, record in rows],
        "next_cursor": next_cursor,
        "next": next_url,
    }
    headers = {"Link": f'<{next_url}>; rel="next"'} if next_url else None
    return web.Response(body=orjson.dumps(body), content_type="application/json", headers=headers)
