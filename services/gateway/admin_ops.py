"""The operator's read and repair endpoints of the admin API (SPLATQ_ADMIN_API_KEY), which
the console's operator view uses: system stats, dead letters (list, show with the death log,
redrive with `from_stage`, purge: the same audited actions as `splatq dlq`) and the scheduled
tasks with their last runs and history (as `splatq tasks list/history`)."""

from __future__ import annotations

import time
from typing import Any

import orjson
from aiohttp import web

from splatq.services.gateway.appkeys import QUEUE, SETTINGS
from splatq.services.gateway.auth import authenticate_admin
from splatq.services.gateway.endpoints import _check_fields, _json_body
from splatq.services.gateway.ops_stats import read_stats
from splatq.services.gateway.problems import ApiError, invalid_request, not_found
from splatq.services.gateway.shape_schema import field_names
from splatq.services.gateway.shapes_requests import MAX_ACTOR, DeadLetterAction
from splatq.services.gateway.views import error_view, rfc3339, stages_view, valid_stream_id
from splatq.shared.engine.queue import DeadLetter
from splatq.shared.engine.stages import PIPELINE, PipelineStage
from splatq.shared.maintenance.audit import person_actor
from splatq.shared.maintenance.config import ConfigError, load_config, retention_defaults
from splatq.shared.maintenance.deadletters import DeadLetterBook, Subject
from splatq.shared.maintenance.dlq_ops import AuditedDeadLetters, describe, newest
from splatq.shared.maintenance.keys import DeadLetterKind, MaintenanceKeys
from splatq.shared.maintenance.store import TaskStore

ACTION_FIELDS = field_names(DeadLetterAction)  # the shape the OpenAPI document states
DEFAULT_LIMIT = 50
MAX_LIMIT = 500
HISTORY = 10
DEATH_LOG_EVENTS = 100


def add_admin_ops_routes(app: web.Application) -> None:
    app.router.add_get("/v1/admin/stats", stats)
    base = "/v1/admin/dead-letters/{kind}"
    app.router.add_get(base, list_dead_letters)
    app.router.add_get(base + "/{partition}/{entry_id}", show_dead_letter)
    app.router.add_post(base + "/{partition}/{entry_id}/redrive", redrive_dead_letter)
    app.router.add_post(base + "/{partition}/{entry_id}/purge", purge_dead_letter)
    app.router.add_get("/v1/admin/tasks", list_tasks)


def _json(body: object, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


async def _admin(request: web.Request) -> None:
    await authenticate_admin(request, request.app[SETTINGS].admin_api_key)


async def stats(request: web.Request) -> web.Response:
    await _admin(request)
    queue = request.app[QUEUE]
    return _json(await read_stats(queue.redis, queue.keys, request.app[SETTINGS]))


# -- dead letters ---------------------------------------------------------------------------


def _kind(request: web.Request) -> DeadLetterKind:
    try:
        return DeadLetterKind(request.match_info["kind"])
    except ValueError:
        raise not_found("dead-letter kind (jobs or webhooks)") from None


def _book(request: web.Request) -> DeadLetterBook:
    return DeadLetterBook(request.app[QUEUE])


def _limit(request: web.Request) -> int:
    raw = request.query.get("limit", str(DEFAULT_LIMIT))
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_LIMIT:
        raise invalid_request(f"limit must be an integer within [1, {MAX_LIMIT}]")
    return int(raw)


def _summary(s: Subject) -> dict[str, Any]:
    """A list row: the entry and what its subject (job or message) says of itself."""
    f = s.fields
    row: dict[str, Any] = {
        "id": s.letter.id,
        "kind": s.kind.value,
        "reason": s.letter.reason,
        "at": rfc3339(s.letter.at_ms),
        "subject": s.subject or None,
        "tenant": f.get("tenant") or s.letter.fields.get("tenant") or None,
        "redrives": int(f["redrives"]) if f.get("redrives", "").isdigit() else 0,
        "redrivable": s.view().redrivable,
    }
    if s.kind is DeadLetterKind.JOBS:
        row["status"] = f.get("status") or None
        row["error"] = (
            {"code": f["error_code"], "message": f.get("error_message", "")}
            if f.get("error_code")
            else None
        )
        row["current_stage"] = f.get("current_stage") or None
    else:
        row["url"] = f.get("url") or s.letter.fields.get("url") or None
        row["event"] = f.get("event_type") or None
    return row


async def list_dead_letters(request: web.Request) -> web.Response:
    await _admin(request)
    kind = _kind(request)
    book = _book(request)
    letters, total = await newest(book, kind, request.app[SETTINGS].partitions, _limit(request))
    subjects = await book.subjects(kind, letters) if letters else []
    return _json({"kind": kind.value, "total": total, "items": [_summary(s) for s in subjects]})


async def _letter(request: web.Request, kind: DeadLetterKind) -> DeadLetter:
    raw_partition = request.match_info["partition"]
    entry_id = request.match_info["entry_id"]
    partitions = request.app[SETTINGS].partitions
    if not raw_partition.isdigit() or int(raw_partition) >= partitions:
        raise not_found("dead letter")
    if not valid_stream_id(entry_id):
        raise not_found("dead letter")
    partition = int(raw_partition)
    book = _book(request)
    key = book.keys.dead_letters(kind, partition)
    entries = await book.redis.xrange(key, entry_id, entry_id)
    if not entries:
        raise not_found("dead letter")
    return DeadLetter(partition, entries[0][0], dict(entries[0][1]))


async def _death_log(request: web.Request, job_id: str) -> dict[str, Any] | None:
    """The dead job as the API shows it, with its stages and its event history."""
    queue = request.app[QUEUE]
    job = await queue.get(job_id) if job_id else None
    if job is None:
        return None
    history = await queue.job_history(job.id, count=DEATH_LOG_EVENTS)
    error = error_view(job)
    return {
        "job_id": job.id,
        "tenant": job.tenant,
        "status": job.status.value,
        "attempts": job.attempts,
        "deliveries": job.deliveries,
        "redrives": job.redrives,
        "error": error,
        "current_stage": job.current_stage or None,
        "stages": stages_view(job, error),
        "events": [
            {"id": eid, "type": kind, "payload": orjson.loads(payload)}
            for eid, kind, payload in history
        ],
    }


async def show_dead_letter(request: web.Request) -> web.Response:
    await _admin(request)
    kind = _kind(request)
    letter = await _letter(request, kind)
    audited = AuditedDeadLetters(_book(request), kind, "")
    body = describe(letter)
    body["kind"] = kind.value
    body["audit"] = await audited.audit_trail(letter)
    body["job"] = await _death_log(request, letter.job_id) if kind is DeadLetterKind.JOBS else None
    return _json(body)


async def _action(request: web.Request) -> tuple[str, PipelineStage | None]:
    """(actor, from_stage) of a redrive or purge body (an empty body is fine)."""
    doc: dict[str, Any] = {}
    if request.can_read_body:
        doc = await _json_body(request)
        _check_fields(doc, ACTION_FIELDS)
    actor = doc.get("actor", "console")
    if not isinstance(actor, str) or not actor or len(actor) > MAX_ACTOR:
        raise invalid_request(f"actor must be a string of 1 to {MAX_ACTOR} characters")
    if not (actor.isascii() and actor.isprintable()):
        raise invalid_request("actor must be visible ASCII")
    raw_stage = doc.get("from_stage")
    if raw_stage is None:
        return actor, None
    names = [s.value for s in PIPELINE]
    if raw_stage not in names:
        raise invalid_request(f"from_stage must be one of {names}")
    return actor, PipelineStage(raw_stage)


async def redrive_dead_letter(request: web.Request) -> web.Response:
    """Redrive one entry (a staged job from `from_stage`, else from the stage that failed),
    recorded in its audit trail as done by `person:<actor>` through the console."""
    await _admin(request)
    kind = _kind(request)
    letter = await _letter(request, kind)
    actor, from_stage = await _action(request)
    if from_stage is not None and kind is DeadLetterKind.WEBHOOKS:
        raise invalid_request("from_stage applies to dead-lettered jobs only")
    audited = AuditedDeadLetters(
        _book(request), kind, person_actor(actor), from_stage, via="console"
    )
    outcome, detail = await audited.redrive(letter)
    if outcome == "gone":
        raise not_found("dead letter")
    if outcome != "redriven":
        raise ApiError(409, "not_redrivable", detail or outcome)
    return _json({"id": letter.id, "outcome": outcome, "job_id": letter.job_id or None})


async def purge_dead_letter(request: web.Request) -> web.Response:
    await _admin(request)
    kind = _kind(request)
    letter = await _letter(request, kind)
    actor, from_stage = await _action(request)
    if from_stage is not None:
        raise invalid_request("from_stage applies to redrives only")
    audited = AuditedDeadLetters(_book(request), kind, person_actor(actor), via="console")
    if not await audited.purge_dead_letter(letter):
        raise not_found("dead letter")
    return web.Response(status=204)


# -- scheduled tasks ------------------------------------------------------------------------


async def list_tasks(request: web.Request) -> web.Response:
    """Every scheduled task of the redriver's configuration (SPLATQ_REDRIVER_CONFIG, else the
    defaults): schedule, last success and failure, whether it runs now, the next slot, and
    its latest runs."""
    await _admin(request)
    settings = request.app[SETTINGS]
    try:
        config = load_config(settings.redriver_config, retention_defaults(settings))
    except ConfigError as exc:
        raise ApiError(
            503, "unavailable", f"the redriver configuration is invalid: {exc}"
        ) from None
    queue = request.app[QUEUE]
    store = TaskStore(queue.redis, queue.scripts, MaintenanceKeys(queue.keys))
    now = time.time()
    tasks = []
    for name, task in config.tasks.items():
        state = await store.state(name)
        tasks.append(
            {
                "task": name,
                "schedule": task.schedule.expression,
                "enabled": task.enabled,
                "running": state.running,
                "checkpoint": state.checkpoint or None,
                "last_success": rfc3339(state.last_success_ms),
                "last_failure": rfc3339(state.last_failure_ms),
                "next_run": rfc3339(int(task.schedule.next_slot(now) * 1000))
                if task.enabled
                else None,
                "history": await store.history(name, HISTORY),
            }
        )
    return _json({"config": config.source, "tasks": tasks})
