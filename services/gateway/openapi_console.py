"""The OpenAPI paths and schemas of the web console (`/`, `/console`, its files) and of the
admin API's operator endpoints it reads (`/v1/admin/stats`, dead letters, scheduled tasks)."""

from __future__ import annotations

from typing import Any

from splatq.services.gateway.admin_ops import MAX_LIMIT
from splatq.shared.engine.stages import PIPELINE

PROBLEM_REF = {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}
_RETRY_AFTER = {"Retry-After": {"schema": {"type": "string"}, "description": "seconds"}}
_TIME_OR_NULL = {"type": ["string", "null"], "format": "date-time"}
_INT_OR_NULL = {"type": ["integer", "null"]}
_NUM_OR_NULL = {"type": ["number", "null"]}
_STR_OR_NULL = {"type": ["string", "null"]}
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


def _problem(description: str, headers: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"description": description, "content": PROBLEM_REF}
    if headers:
        out["headers"] = headers
    return out


def _ok(description: str, ref: str) -> dict[str, Any]:
    schema = {"$ref": f"#/components/schemas/{ref}"}
    return {"200": {"description": description,
                    "content": {"application/json": {"schema": schema}}}}  # fmt: skip


_ADMIN_ERRORS = {
    "401": _problem("unauthorized: no API key, or an unknown one"),
    "403": _problem("forbidden (a tenant's key, not the admin key) or admin_disabled (no "
                    "SPLATQ_ADMIN_API_KEY)"),
    "503": _problem("unavailable: Redis unreachable", _RETRY_AFTER),
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
_ACTION_BODY = {
    "required": False,
    "content": {"application/json": {"schema": {
        "type": "object", "additionalProperties": False,
        "properties": {
            "actor": {"type": "string", "minLength": 1, "maxLength": 64,
                      "description": "who acts, recorded as person:<actor> (default console)"},
            "from_stage": {"type": "string", "enum": [s.value for s in PIPELINE],
                           "description": "redrive a staged job from this stage (jobs only)"},
        },
    }}},
}  # fmt: skip
_ACTION_ERRORS = {
    "400": _problem("invalid_request: bad JSON, an unknown field, a bad actor or stage"),
    "404": _problem("not_found: no such entry (redriven or purged already)"),
    "413": _problem("payload_too_large: the body exceeds 16 KB"),
    "415": _problem("unsupported_media_type: the body must be application/json"),
}
_STATIC_HEADERS = {
    "Content-Security-Policy": {"schema": {"type": "string"},
                                "description": "no inline script or style; this origin only"},
}  # fmt: skip

_STREAM_ROW = {
    "type": "object",
    "required": ["partition", "stage", "stream", "depth", "queued", "ready", "running",
                 "consumers", "oldest_waiting_s"],
    "properties": {
        "partition": {"type": "integer"}, "stage": {"type": "string"},
        "stream": {"type": "string", "enum": ["interactive", "synthesis"]},
        "depth": {"type": "integer", "description": "stream length (acknowledged entries too)"},
        "queued": {"type": "integer", "description": "in the tenants' fair queues"},
        "ready": {**_INT_OR_NULL, "description": "in the stream, not handed out"},
        "waiting": _INT_OR_NULL,
        "running": {"type": "integer", "description": "handed to a worker, not acknowledged"},
        "consumers": {"type": "integer"},
        "oldest_waiting_s": _NUM_OR_NULL,
        "delayed": {"type": "integer", "description": "retries waiting for their due time"},
    },
}  # fmt: skip
_WORKER = {
    "type": "object",
    "required": ["name", "last_seen", "alive", "stages", "slots", "in_use", "running", "leases"],
    "properties": {
        "name": {"type": "string"}, "last_seen": _TIME_OR_NULL,
        "alive": {"type": "boolean", "description": "its card is fresh (it keeps ticking)"},
        "host": _STR_OR_NULL, "pid": _INT_OR_NULL, "started_at": _TIME_OR_NULL,
        "stages": {"type": "array", "items": {"type": "string"}},
        "slots": {"type": "integer"}, "in_use": {"type": "integer"},
        "running": {"type": "integer"},
        "leases": {"type": "array", "items": {"type": "object", "properties": {
            "partition": {"type": "integer"}, "stage": {"type": "string"},
            "stream": {"type": "string"}, "leases": {"type": "integer"},
            "idle_ms": {"type": "integer"}}}},
    },
}  # fmt: skip
_STATS = {
    "type": "object",
    "required": ["generated_at", "partitions", "streams", "throughput", "workers", "dead_letters"],
    "properties": {
        "generated_at": {"type": "string", "format": "date-time"},
        "partitions": {"type": "integer"},
        "streams": {"type": "array", "items": _STREAM_ROW},
        "throughput": {"type": "object", "required": ["window_s", "stages", "jobs"], "properties": {
            "window_s": {"type": "integer"}, "truncated": {"type": "boolean"},
            "stages": {"type": "array", "items": {"type": "object", "properties": {
                "stage": {"type": "string"}, "succeeded": {"type": "integer"},
                "per_minute": {"type": "number"}}}},
            "jobs": {"type": "object", "properties": {
                "completed": {"type": "integer"}, "failed": {"type": "integer"},
                "canceled": {"type": "integer"}}},
        }},
        "workers": {"type": "array", "items": _WORKER},
        "dead_letters": {"type": "object", "properties": {
            "jobs": {"type": "integer"}, "webhooks": {"type": "integer"}}},
    },
}  # fmt: skip
_LETTER_ROW = {
    "type": "object",
    "required": ["id", "kind", "reason", "at", "subject", "tenant", "redrives", "redrivable"],
    "properties": {
        "id": {"type": "string", "description": "<partition>/<entry id>"},
        "kind": {"type": "string", "enum": ["jobs", "webhooks"]},
        "reason": {"type": "string"}, "at": _TIME_OR_NULL,
        "subject": {**_STR_OR_NULL, "description": "the job id or the webhook message id"},
        "tenant": _STR_OR_NULL, "redrives": {"type": "integer"},
        "redrivable": {"type": "boolean"}, "status": _STR_OR_NULL,
        "current_stage": _STR_OR_NULL, "url": _STR_OR_NULL, "event": _STR_OR_NULL,
        "error": {"type": ["object", "null"]},
    },
}  # fmt: skip
_LETTER = {
    "type": "object",
    "required": ["id", "kind", "reason", "at", "fields", "audit", "job"],
    "properties": {
        "id": {"type": "string"}, "kind": {"type": "string"}, "reason": {"type": "string"},
        "job_id": _STR_OR_NULL, "at": {"type": "string"},
        "fields": {"type": "object", "additionalProperties": {"type": "string"}},
        "attempts": {"type": "array", "items": {"type": "object"},
                     "description": "a webhook message's delivery attempts"},
        "audit": {"type": "array", "items": {"type": "object"}},
        "job": {"type": ["object", "null"],
                "description": "the dead job: status, error, stages and events (its death log)"},
    },
}  # fmt: skip
_TASKS = {
    "type": "object",
    "required": ["config", "tasks"],
    "properties": {
        "config": {"type": "string", "description": "the redriver configuration's source"},
        "tasks": {"type": "array", "items": {"type": "object", "required": ["task", "schedule"],
            "properties": {
                "task": {"type": "string"}, "schedule": {"type": "string"},
                "enabled": {"type": "boolean"}, "running": {"type": "boolean"},
                "checkpoint": _STR_OR_NULL, "last_success": _TIME_OR_NULL,
                "last_failure": _TIME_OR_NULL, "next_run": _TIME_OR_NULL,
                "history": {"type": "array", "items": {"type": "object"}}}}},
    },
}  # fmt: skip

SCHEMAS: dict[str, Any] = {
    "AdminStats": _STATS,
    "DeadLetterPage": {
        "type": "object",
        "required": ["kind", "total", "items"],
        "properties": {
            "kind": {"type": "string"},
            "total": {"type": "integer"},
            "items": {"type": "array", "items": _LETTER_ROW},
        },
    },
    "DeadLetter": _LETTER,
    "ScheduledTasks": _TASKS,
}


def _page(operation_id: str, description: str, content: dict[str, Any]) -> dict[str, Any]:
    return {"get": {
        "operationId": operation_id, "security": [], "description": description,
        "responses": {"200": {"description": "the file", "headers": _STATIC_HEADERS,
                              "content": content}},
    }}  # fmt: skip


def console_paths() -> dict[str, Any]:
    base = "/v1/admin/dead-letters/{kind}"
    entry = base + "/{partition}/{entry_id}"
    text = {"schema": {"type": "string"}}
    return {
        "/": {
            "get": {
                "operationId": "root",
                "security": [],
                "responses": {
                    "302": {
                        "description": "to /console",
                        "headers": {"Location": {"schema": {"type": "string"}}},
                    }
                },
            }
        },
        "/console": _page(
            "console",
            "The web console's page (docs/console.md): sign in with an API key or the admin key.",
            {"text/html": text},
        ),
        "/console/{path}": {
            "get": {
                "operationId": "consoleFile",
                "security": [],
                "parameters": [
                    {
                        "name": "path",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "string", "pattern": "^[A-Za-z0-9_./-]+$"},
                    }
                ],
                "responses": {
                    "200": {
                        "description": "the file",
                        "headers": _STATIC_HEADERS,
                        "content": {
                            "text/javascript": text,
                            "text/css": text,
                            "text/html": text,
                            "image/svg+xml": text,
                            "text/plain": text,
                        },
                    },
                    "404": _problem("not_found: no such file"),
                },
            }
        },
        "/v1/admin/stats": {
            "get": {
                "operationId": "adminStats",
                "security": _ADMIN,
                "description": "Every stream and stage per partition (depth, queued in fair "
                "queues, ready, running, oldest waiting age), stage successes and job outcomes "
                "over the last five minutes, the worker processes (stages, slots, leases) and the "
                "dead-letter depths: the console's operator view, read from Redis.",
                "responses": {**_ok("the stats", "AdminStats"), **_ADMIN_ERRORS},
            }
        },
        base: {
            "get": {
                "operationId": "adminListDeadLetters",
                "security": _ADMIN,
                "parameters": [
                    _KIND,
                    {
                        "name": "limit",
                        "in": "query",
                        "required": False,
                        "schema": {
                            "type": "integer",
                            "minimum": 1,
                            "maximum": MAX_LIMIT,
                            "default": 50,
                        },
                    },
                ],
                "responses": {
                    **_ok("the newest entries, over every partition", "DeadLetterPage"),
                    "400": _problem("invalid_request: bad limit"),
                    "404": _problem("not_found: no such kind"),
                    **_ADMIN_ERRORS,
                },
            }
        },
        entry: {
            "get": {
                "operationId": "adminShowDeadLetter",
                "security": _ADMIN,
                "parameters": _ENTRY,
                "responses": {
                    **_ok("the entry, its death log and audit trail", "DeadLetter"),
                    "404": _problem("not_found: no such entry"),
                    **_ADMIN_ERRORS,
                },
            }
        },
        entry + "/redrive": {
            "post": {
                "operationId": "adminRedriveDeadLetter",
                "security": _ADMIN,
                "parameters": _ENTRY,
                "description": "As `splatq dlq redrive` (with `--from-stage`): back to its queue, "
                "recorded in the entry's audit trail by the same script.",
                "requestBody": _ACTION_BODY,
                "responses": {
                    "200": {
                        "description": "redriven",
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "required": ["id", "outcome"],
                                    "properties": {
                                        "id": {"type": "string"},
                                        "outcome": {"const": "redriven"},
                                        "job_id": _STR_OR_NULL,
                                    },
                                }
                            }
                        },
                    },
                    **_ACTION_ERRORS,
                    "409": _problem("not_redrivable: no job or message to send again"),
                    **_ADMIN_ERRORS,
                },
            }
        },
        entry + "/purge": {
            "post": {
                "operationId": "adminPurgeDeadLetter",
                "security": _ADMIN,
                "parameters": _ENTRY,
                "description": "As `splatq dlq purge`: the entry is deleted, the audit trail keeps "
                "who did it.",
                "requestBody": _ACTION_BODY,
                "responses": {"204": {"description": "purged"}, **_ACTION_ERRORS, **_ADMIN_ERRORS},
            }
        },
        "/v1/admin/tasks": {
            "get": {
                "operationId": "adminListTasks",
                "security": _ADMIN,
                "responses": {
                    **_ok("every task of the redriver's configuration", "ScheduledTasks"),
                    **_ADMIN_ERRORS,
                },
            }
        },
    }
