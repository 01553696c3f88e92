"""The OpenAPI paths and schemas of the web console (`/`, `/console`, its files) and of the
admin API's operator endpoints it reads (`/v1/admin/stats`, dead letters, scheduled tasks).
The schemas are derived from the shapes (services/gateway/shapes_admin.py, shapes_requests.py).
"""

from __future__ import annotations

from typing import Any

from splatq.services.gateway.admin_ops import MAX_LIMIT
from splatq.services.gateway.openapi_common import RETRY_AFTER, json_request, ok, problem
from splatq.services.gateway.shape_schema import components, ref
from splatq.services.gateway.shapes import COMPONENT_NAMES, schema
from splatq.services.gateway.shapes_admin import (
    AdminStats,
    DeadLetter,
    DeadLetterPage,
    Redriven,
    ScheduledTasks,
)
from splatq.services.gateway.shapes_requests import DeadLetterAction

_ADMIN: list[dict[str, list[str]]] = [{"adminKey": []}]

OPERATIONS: dict[str, tuple[str, str]] = {
    "root": ("Console", "Lead to the web console"),
    "console": ("Console", "The web console"),
    "consoleFile": ("Console", "A file of the web console (script, style, icon)"),
    "adminStats": ("Admin", "Streams, stages, throughput, workers and dead-letter depths"),
    "adminListDeadLetters": ("Admin", "List dead letters, newest first"),
    "adminShowDeadLetter": ("Admin", "Get a dead letter with its death log and audit trail"),
    "adminRedriveDeadLetter": ("Admin", "Redrive a dead letter"),
    "adminPurgeDeadLetter": ("Admin", "Purge a dead letter"),
    "adminListTasks": ("Admin", "List the scheduled tasks with their last runs"),
}
TAG = {"name": "Console", "description": "The web console: a client of this API (docs/console.md)."}
SCHEMAS: dict[str, Any] = components(
    [AdminStats, DeadLetterPage, DeadLetter, ScheduledTasks], COMPONENT_NAMES
)

_ADMIN_ERRORS = {
    "401": problem("unauthorized: no API key, or an unknown one"),
    "403": problem("forbidden (a tenant's key, not the admin key) or admin_disabled (no "
                   "SPLATQ_ADMIN_API_KEY)"),
    "503": problem("unavailable: Redis unreachable", RETRY_AFTER),
}  # fmt: skip
_KIND = {"name": "kind", "in": "path", "required": True,
         "schema": {"type": "string", "enum": ["jobs", "webhooks"]}}  # fmt: skip
_ENTRY = [
    _KIND,
    {"name": "partition", "in": "path", "required": True,
     "schema": {"type": "string", "pattern": "^[0-9]{1,6}$"}},
    {"name": "entry_id", "in": "path", "required": True,
     "schema": {"type": "string", "pattern": "^[0-9]{1,20}-[0-9]{1,20}$"},
     "description": "the entry id of `<partition>/<entry id>` (as `splatq dlq list` prints)"},
]  # fmt: skip
_ACTION_ERRORS = {
    "400": problem("invalid_request: bad JSON, an unknown field, a bad actor or stage"),
    "404": problem("not_found: no such entry (redriven or purged already)"),
    "413": problem("payload_too_large: the body exceeds 16 KB"),
    "415": problem("unsupported_media_type: the body must be application/json"),
}
_STATIC_HEADERS = {
    "Content-Security-Policy": {"schema": {"type": "string"},
                                "description": "no inline script or style; this origin only"},
}  # fmt: skip
_TEXT = {"schema": {"type": "string"}}
_DEAD_LETTERS = "/v1/admin/dead-letters/{kind}"
_ENTRY_PATH = _DEAD_LETTERS + "/{partition}/{entry_id}"


def console_paths() -> dict[str, Any]:
    """The console's own files, then the operator endpoints it reads."""
    return {**_console_files(), **_stats(), **_dead_letters(), **_actions(), **_tasks()}


def _static(operation_id: str, description: str | None, content: dict[str, Any],
            **extra: Any) -> dict[str, Any]:  # fmt: skip
    """A file of the console: no authentication, the console's Content-Security-Policy."""
    out: dict[str, Any] = {"operationId": operation_id, "security": [], **extra}
    if description is not None:
        out["description"] = description
    ok_file = {"description": "the file", "headers": _STATIC_HEADERS, "content": content}
    out["responses"] = {"200": ok_file, **out.pop("responses", {})}
    return {"get": out}


def _console_files() -> dict[str, Any]:
    files = {media: _TEXT for media in ("text/javascript", "text/css", "text/html",
                                        "image/svg+xml", "text/plain")}  # fmt: skip
    path = {"name": "path", "in": "path", "required": True,
            "schema": {"type": "string", "pattern": "^[A-Za-z0-9_./-]+$"}}  # fmt: skip
    return {
        "/": {
            "get": {
                "operationId": "root",
                "security": [],
                "responses": {"302": {"description": "to /console",
                                      "headers": {"Location": {"schema": {"type": "string"}}}}},
            }
        },
        "/console": _static(
            "console",
            "The web console's page (docs/console.md): sign in with an API key or the admin key.",
            {"text/html": _TEXT},
        ),
        "/console/{path}": _static(
            "consoleFile", None, files, parameters=[path],
            responses={"404": problem("not_found: no such file")},
        ),
    }  # fmt: skip


def _stats() -> dict[str, Any]:
    return {
        "/v1/admin/stats": {
            "get": {
                "operationId": "adminStats",
                "security": _ADMIN,
                "description": "Every stream and stage per partition (depth, queued in fair "
                "queues, ready, running, oldest waiting age), stage successes and job outcomes "
                "over the last five minutes, the worker processes (stages, slots, leases) and the "
                "dead-letter depths: the console's operator view, read from Redis.",
                "responses": {**ok("the stats", ref("AdminStats")), **_ADMIN_ERRORS},
            }
        },
    }


def _dead_letters() -> dict[str, Any]:
    limit = {
        "name": "limit",
        "in": "query",
        "required": False,
        "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": 50},
    }
    return {
        _DEAD_LETTERS: {
            "get": {
                "operationId": "adminListDeadLetters",
                "security": _ADMIN,
                "parameters": [_KIND, limit],
                "responses": {
                    **ok("the newest entries, over every partition", ref("DeadLetterPage")),
                    "400": problem("invalid_request: bad limit"),
                    "404": problem("not_found: no such kind"),
                    **_ADMIN_ERRORS,
                },
            }
        },
        _ENTRY_PATH: {
            "get": {
                "operationId": "adminShowDeadLetter",
                "security": _ADMIN,
                "parameters": _ENTRY,
                "responses": {
                    **ok("the entry, its death log and audit trail", ref("DeadLetter")),
                    "404": problem("not_found: no such entry"),
                    **_ADMIN_ERRORS,
                },
            }
        },
    }  # fmt: skip


def _actions() -> dict[str, Any]:
    """A dead letter's redrive and purge: the same optional body (DeadLetterAction)."""
    body = json_request(DeadLetterAction, required=False)
    return {
        _ENTRY_PATH + "/redrive": {
            "post": {
                "operationId": "adminRedriveDeadLetter",
                "security": _ADMIN,
                "parameters": _ENTRY,
                "description": "As `splatq dlq redrive` (with `--from-stage`): back to its queue, "
                "recorded in the entry's audit trail by the same script.",
                "requestBody": body,
                "responses": {
                    **ok("redriven", schema(Redriven)),
                    **_ACTION_ERRORS,
                    "409": problem("not_redrivable: no job or message to send again"),
                    **_ADMIN_ERRORS,
                },
            }
        },
        _ENTRY_PATH + "/purge": {
            "post": {
                "operationId": "adminPurgeDeadLetter",
                "security": _ADMIN,
                "parameters": _ENTRY,
                "description": "As `splatq dlq purge`: the entry is deleted, the audit trail keeps "
                "who did it.",
                "requestBody": body,
                "responses": {"204": {"description": "purged"}, **_ACTION_ERRORS, **_ADMIN_ERRORS},
            }
        },
    }


def _tasks() -> dict[str, Any]:
    return {
        "/v1/admin/tasks": {
            "get": {
                "operationId": "adminListTasks",
                "security": _ADMIN,
                "responses": {
                    **ok("every task of the redriver's configuration", ref("ScheduledTasks")),
                    **_ADMIN_ERRORS,
                },
            }
        },
    }
