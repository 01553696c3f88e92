"""The OpenAPI 3.1 description of the gateway's HTTP API (served at /openapi.json and rendered
at /docs), assembled from one module per resource: openapi_jobs (submit, list, read, cancel,
artifacts, events), openapi_events (event payloads, webhooks, SSE items, attempts),
openapi_endpoints (webhook endpoints and secrets), openapi_tenants (usage and admin),
openapi_console (the console and the operator endpoints), openapi_upstream (hosted models and
the result cache) and openapi_common (problems, named enums). Every request and answer schema
is derived from the API's shapes (services/gateway/shapes.py, shapes_admin.py,
shapes_requests.py) by services/gateway/shape_schema.py.

Tests check that every route is described, that every operation has a summary and a tag, that
the request schemas name exactly the fields the parsers accept, that a client generated from it
(openapi-python-client) submits, follows and downloads, and a schemathesis run (every check,
stateful phase included) checks the whole of it against a running gateway.
"""

from __future__ import annotations

from typing import Any

from splatq.services.gateway.openapi_common import ENUMS, RETRY_AFTER, problem
from splatq.services.gateway.openapi_console import OPERATIONS as CONSOLE_OPERATIONS
from splatq.services.gateway.openapi_console import SCHEMAS as CONSOLE_SCHEMAS
from splatq.services.gateway.openapi_console import TAG as CONSOLE_TAG
from splatq.services.gateway.openapi_console import console_paths
from splatq.services.gateway.openapi_endpoints import ENDPOINT_SCHEMA, endpoint_paths, secret_paths
from splatq.services.gateway.openapi_events import (
    ATTEMPT_PAGE,
    ATTEMPT_SCHEMA,
    event_schemas,
    webhooks,
)
from splatq.services.gateway.openapi_jobs import JOB_SCHEMA, job_paths
from splatq.services.gateway.openapi_jobs import SCHEMAS as JOB_SCHEMAS
from splatq.services.gateway.openapi_tenants import SCHEMAS as TENANT_SCHEMAS
from splatq.services.gateway.openapi_tenants import tenant_paths
from splatq.services.gateway.openapi_upstream import OPERATIONS as UPSTREAM_OPERATIONS
from splatq.services.gateway.openapi_upstream import SCHEMAS as UPSTREAM_SCHEMAS
from splatq.services.gateway.openapi_upstream import upstream_paths
from splatq.services.gateway.shapes import JobStage, Problem, schema
from splatq.shared import __version__

TAGS = [
    {"name": "Jobs", "description": "Submit, list, read and cancel jobs; fetch artifacts."},
    {"name": "Events", "description": "Follow a job: Server-Sent Events and delivery logs."},
    {"name": "Webhook endpoints",
     "description": "Registered receivers of the tenant's events, their secrets and logs."},
    {"name": "Webhook secret", "description": "The tenant's secret for per-job webhook_urls."},
    {"name": "Usage", "description": "The caller's GPU quota and usage."},
    {"name": "Admin", "description": "Tenants, API keys and quotas; stats, dead letters and "
     "scheduled tasks (the admin key only)."},
    {"name": "Operations", "description": "Health, readiness, metrics and this document."},
    CONSOLE_TAG,
]  # fmt: skip
# Every operation's tag and summary, by operationId (a test checks none is missing).
OPERATIONS: dict[str, tuple[str, str]] = {
    "submitJob": ("Jobs", "Submit an image (or an image URL) for reconstruction"),
    "listJobs": ("Jobs", "List your jobs, newest first"),
    "getJob": ("Jobs", "Get a job"),
    "cancelJob": ("Jobs", "Cancel a job"),
    "getArtifact": ("Jobs", "Download an artifact of a completed job"),
    "jobEvents": ("Events", "Stream a job's events (Server-Sent Events)"),
    "jobDeliveries": ("Events", "List a job's webhook delivery attempts"),
    "webhookSecret": ("Webhook secret", "Get the tenant's webhook signing secret"),
    "rotateWebhookSecret": ("Webhook secret", "Rotate the tenant's webhook signing secret"),
    "createWebhookEndpoint": ("Webhook endpoints", "Register a webhook endpoint"),
    "listWebhookEndpoints": ("Webhook endpoints", "List webhook endpoints"),
    "getWebhookEndpoint": ("Webhook endpoints", "Get a webhook endpoint and its health"),
    "updateWebhookEndpoint": ("Webhook endpoints", "Change a webhook endpoint"),
    "deleteWebhookEndpoint": ("Webhook endpoints", "Delete a webhook endpoint"),
    "rotateWebhookEndpointSecret": ("Webhook endpoints", "Rotate an endpoint's secret"),
    "recoverWebhookEndpoint": ("Webhook endpoints", "Re-send an endpoint's failed messages"),
    "testWebhookEndpoint": ("Webhook endpoints", "Send a test event to an endpoint"),
    "listWebhookEndpointAttempts": ("Webhook endpoints", "List an endpoint's attempts"),
    "getUsage": ("Usage", "Get your GPU quota and usage"),
    "adminCreateTenant": ("Admin", "Create a tenant"),
    "adminListTenants": ("Admin", "List tenants"),
    "adminShowTenant": ("Admin", "Get a tenant with its quota, usage and keys"),
    "adminUpdateTenant": ("Admin", "Change a tenant's weight or running caps"),
    "adminAddKey": ("Admin", "Create (or rotate) an API key"),
    "adminListKeys": ("Admin", "List a tenant's API keys"),
    "adminRevokeKey": ("Admin", "Revoke an API key"),
    "adminGetQuota": ("Admin", "Get a tenant's quota and usage"),
    "adminSetQuota": ("Admin", "Set a tenant's quota"),
    "healthz": ("Operations", "Liveness"),
    "readyz": ("Operations", "Readiness (Redis reachable)"),
    "metrics": ("Operations", "Prometheus metrics"),
    "openapi": ("Operations", "This OpenAPI document"),
    "docs": ("Operations", "The API reference as a web page"),
    **CONSOLE_OPERATIONS,
    **UPSTREAM_OPERATIONS,
}


MALFORMED_REQUEST = problem(
    "invalid_request: the HTTP request itself is malformed (its framing or a header the "
    "server's parser refuses)"
)


def openapi_document(server_url: str, max_wait_s: int = 60) -> dict[str, Any]:
    """The document; `max_wait_s` is the gateway's bound on `Prefer: wait`."""
    doc = _document(server_url, max_wait_s)
    for path_item in doc["paths"].values():
        for operation in path_item.values():
            tag, summary = OPERATIONS[operation["operationId"]]
            operation.setdefault("tags", [tag])
            operation.setdefault("summary", summary)
            # Any request can be malformed below the API (framing, a bad Content-Length, a
            # header the parser refuses): the server answers 400 invalid_request before any
            # handler runs, whatever the operation.
            operation["responses"].setdefault("400", MALFORMED_REQUEST)
    return doc


def _document(server_url: str, max_wait_s: int) -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "tags": TAGS,
        "webhooks": webhooks(),
        "info": {
            "title": "splatq",
            "version": __version__,  # the package's version; the API itself is /v1
            "description": "Asynchronous image → 3D Gaussian Splatting jobs. Submit an image, "
            "get a job id at once (202), follow it by polling, Server-Sent Events or webhooks. "
            "Retention: a finished job's record (and its listing entry) is kept for the "
            "deployment's SPLATQ_JOB_RETENTION_S (7 days by default), its artifacts for "
            "SPLATQ_ARTIFACT_RETENTION_S (30 days by default). Every error is "
            "application/problem+json with a stable `code`.",
        },
        "servers": [{"url": server_url}],
        "security": [{"bearer": []}],
        "paths": {
            **job_paths(max_wait_s),
            **secret_paths(),
            **endpoint_paths(),
            **tenant_paths(),
            **console_paths(),
            **upstream_paths(),
            **_operations_paths(),
        },
        "components": {
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "adminKey": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "SPLATQ_ADMIN_API_KEY (the /v1/admin/ paths, and /metrics "
                    "on the API port)",
                },
            },
            "schemas": {
                "Problem": schema(Problem),
                **ENUMS,
                **JOB_SCHEMAS,
                "Job": JOB_SCHEMA,
                "JobStage": schema(JobStage),
                **event_schemas(),
                "DeliveryAttempt": ATTEMPT_SCHEMA,
                "DeliveryAttemptPage": ATTEMPT_PAGE,
                "WebhookEndpoint": ENDPOINT_SCHEMA,
                **TENANT_SCHEMAS,
                **CONSOLE_SCHEMAS,
                **UPSTREAM_SCHEMAS,
            },
        },
    }


def _operations_paths() -> dict[str, Any]:
    """Health, readiness, metrics and this document: no authentication (but /metrics on the
    API port: the admin key)."""

    def plain(operation_id: str, description: str, content: dict[str, Any]) -> dict[str, Any]:
        return {
            "get": {
                "operationId": operation_id,
                "security": [],
                "responses": {"200": {"description": description, "content": content}},
            }
        }

    obj = {"application/json": {"schema": {"type": "object"}}}
    out = {
        "/healthz": plain("healthz", "the process is alive", obj),
        "/readyz": plain("readyz", "Redis is reachable", obj),
        "/metrics": plain("metrics", "Prometheus text format",
                          {"text/plain": {"schema": {"type": "string"}}}),
        "/openapi.json": plain("openapi", "this document", obj),
        "/docs": plain("docs", "HTML", {"text/html": {"schema": {"type": "string"}}}),
    }  # fmt: skip
    out["/readyz"]["get"]["responses"]["503"] = problem("not_ready")
    metrics = out["/metrics"]["get"]
    metrics["security"] = [{"adminKey": []}]
    metrics["description"] = (
        "Prometheus metrics, on this port behind the admin key. With SPLATQ_METRICS_PORT the "
        "gateway serves them there, without a key (for Prometheus), and this port answers 404."
    )
    metrics["responses"].update(
        {
            "401": problem("unauthorized: no key, or an unknown one"),
            "403": problem("forbidden (a tenant's key) or admin_disabled"),
            "404": problem("not_found: served on SPLATQ_METRICS_PORT instead"),
            "429": problem("too_many_auth_failures (as for the admin API)", RETRY_AFTER),
        }
    )
    out["/docs"]["get"]["description"] = (
        "This document as a self-contained HTML page (no scripts, no external resources)."
    )
    return out
