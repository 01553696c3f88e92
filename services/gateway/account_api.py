"""The tenant's own account: a job's webhook deliveries, the tenant's webhook signing secret
(and its rotation), and GET /v1/usage (the GPU quota)."""

from __future__ import annotations

import structlog
from aiohttp import web

from splatq.services.gateway import quota_gate
from splatq.services.gateway.appkeys import (
    QUEUE,
    QUOTAS,
)
from splatq.services.gateway.auth import authenticate
from splatq.services.gateway.responses import json_response, owned_job
from splatq.services.gateway.server import NO_STORE
from splatq.services.gateway.views import rfc3339
from splatq.shared.webhooks.store import WebhookStore

log = structlog.get_logger("splatq.gateway")
OVERLOAD_RETRY_AFTER_S = 5
STREAMS_RETRY_AFTER_S = 5


async def job_deliveries(request: web.Request) -> web.Response:
    """Every webhook delivery attempt for this job, oldest first."""
    tenant = await authenticate(request)
    job = await owned_job(request, tenant)
    store = WebhookStore(request.app[QUEUE])
    return json_response({"job_id": job.id, "deliveries": await store.deliveries(job.id)})


async def webhook_secret(request: web.Request) -> web.Response:
    """The tenant's signing secret for per-job webhook_urls (created on first use)."""
    tenant = await authenticate(request)
    store = WebhookStore(request.app[QUEUE])
    secret = await store.tenant_secret(tenant)
    return _secret_response(secret, await store.previous_secret_expires_ms(tenant))


async def rotate_webhook_secret(request: web.Request) -> web.Response:
    """A new tenant secret; deliveries carry signatures with both for the overlap."""
    tenant = await authenticate(request)
    store = WebhookStore(request.app[QUEUE])
    secret = await store.rotate_tenant_secret(tenant)
    return _secret_response(secret, await store.previous_secret_expires_ms(tenant))


def _secret_response(secret: str, previous_expires_ms: int) -> web.Response:
    return json_response(
        {
            "secret": secret,
            "scheme": "Standard Webhooks (v1, HMAC-SHA256)",
            "previous_secret_expires_at": rfc3339(previous_expires_ms),
        },
        headers=dict(NO_STORE),
    )


async def usage(request: web.Request) -> web.Response:
    """The calling tenant's GPU quota in the current period: quota, reserved, used, reset."""
    tenant = await authenticate(request)
    return json_response(quota_gate.usage_view(await request.app[QUOTAS].usage(tenant)))
