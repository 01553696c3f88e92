"""The gateway's routing table: every path of the public contract and the handler module
that answers it (one module per resource: jobs_api, artifacts_api, events_api, account_api,
ops_api; endpoints, admin, admin_ops, upstream and console add their own)."""

from __future__ import annotations

from aiohttp import web

from splatq.services.gateway import (
    account_api,
    artifacts_api,
    events_api,
    jobs_api,
    ops_api,
    upstream,
)
from splatq.services.gateway.admin import add_admin_routes
from splatq.services.gateway.admin_ops import add_admin_ops_routes
from splatq.services.gateway.appkeys import SETTINGS
from splatq.services.gateway.console import add_console_routes
from splatq.services.gateway.endpoints import add_endpoint_routes


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/jobs", jobs_api.submit_job)
    app.router.add_get("/v1/jobs", jobs_api.list_jobs)
    app.router.add_get("/v1/jobs/{job_id}", jobs_api.get_job)
    app.router.add_post("/v1/jobs/{job_id}/cancel", jobs_api.cancel_job)
    app.router.add_get("/v1/jobs/{job_id}/artifacts/{name}", artifacts_api.get_artifact)
    app.router.add_get("/v1/jobs/{job_id}/events", events_api.job_events)
    app.router.add_get("/v1/jobs/{job_id}/deliveries", account_api.job_deliveries)
    app.router.add_get("/v1/webhook-secret", account_api.webhook_secret)
    app.router.add_post("/v1/webhook-secret/rotate", account_api.rotate_webhook_secret)
    add_endpoint_routes(app)
    app.router.add_get("/v1/usage", account_api.usage)
    add_admin_routes(app)
    add_admin_ops_routes(app)
    upstream.install(app, app[SETTINGS])  # the result cache's admin, the vendor's webhook
    app.router.add_get("/healthz", ops_api.healthz)
    app.router.add_get("/readyz", ops_api.readyz)
    app.router.add_get("/metrics", ops_api.metrics)
    app.router.add_get("/openapi.json", ops_api.openapi)
    app.router.add_get("/docs", ops_api.docs)
    add_console_routes(app)  # /console, and / leading there
