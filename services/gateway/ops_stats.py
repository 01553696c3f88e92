"""GET /v1/admin/stats: the operator's view of the system in one read, for the console.

Every stream and stage (depth, queued in the fair queues, ready, running, oldest waiting age),
throughput over the last minutes (stage successes and job outcomes counted from the
partitions' event streams), the worker processes (their cards: stages, slots, jobs running;
and the leases each holds per stream) and the dead-letter depths. Read-only, from Redis; no
Prometheus scrape. Counting is pure (`count_events`); the rest is thin I/O.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import orjson
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from splatq.services.gateway.views import rfc3339
from splatq.shared.engine.backlog import PartitionBacklog, read_stage_backlogs
from splatq.shared.engine.events import EventType
from splatq.shared.engine.keys import STREAMS, KeySchema
from splatq.shared.engine.stages import ALL_STAGES, PIPELINE, StageStatus
from splatq.shared.maintenance.keys import DeadLetterKind, MaintenanceKeys
from splatq.shared.settings import Settings

THROUGHPUT_WINDOW_S = 300
# Events read per partition for the throughput window: a bound on the request's cost; a
# window with more says so (`truncated`).
MAX_WINDOW_EVENTS = 20_000
_OUTCOMES = {EventType.COMPLETED.value: "completed", EventType.FAILED.value: "failed",
             EventType.CANCELED.value: "canceled"}  # fmt: skip


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def stream_rows(backlogs: Iterable[tuple[str, PartitionBacklog]]) -> list[dict[str, Any]]:
    """One row per partition, stage and class (as `splatq info`)."""
    return [
        {
            "partition": b.partition,
            "stage": stage or ALL_STAGES[0].value,
            "stream": s.stream.value,
            "depth": s.length,
            "queued": s.queued,
            "ready": s.ready,
            "waiting": s.queued + s.ready if s.ready is not None else None,
            "running": s.pending,
            "consumers": s.consumers,
            "oldest_waiting_s": (
                round(s.oldest_waiting_age_s, 3) if s.oldest_waiting_age_s is not None else None
            ),
            "delayed": b.delayed if not stage else 0,
        }
        for stage, b in backlogs
        for s in b.streams
    ]


def count_events(entries: Iterable[tuple[str, str]]) -> tuple[Counter[str], Counter[str]]:
    """(stage successes by stage, job outcomes) of (type, payload) event entries. A stage's
    success is its `progress` event with `stage_status: succeeded`; the last stage's is the
    job's `completed`."""
    stages: Counter[str] = Counter()
    jobs: Counter[str] = Counter()
    progress = EventType.PROGRESS.value
    for kind, payload in entries:
        if kind in _OUTCOMES:
            jobs[_OUTCOMES[kind]] += 1
            if kind == EventType.COMPLETED.value:
                stages[PIPELINE[-1].value] += 1  # publish: the last stage
        elif kind == progress and '"stage_status"' in payload:
            data = orjson.loads(payload).get("data", {})
            if data.get("stage_status") == StageStatus.SUCCEEDED.value and data.get("stage"):
                stages[str(data["stage"])] += 1
    return stages, jobs


async def _throughput(redis: Redis, keys: KeySchema, partitions: int) -> dict[str, Any]:
    since_ms = int(time.time() * 1000) - THROUGHPUT_WINDOW_S * 1000
    pipe = redis.pipeline(transaction=False)
    for p in range(partitions):
        pipe.xrange(keys.events(p), min=f"{since_ms}-0", max="+", count=MAX_WINDOW_EVENTS)
    replies = await pipe.execute()
    truncated = any(len(r) >= MAX_WINDOW_EVENTS for r in replies)
    entries = (
        (_text(f.get("type", "")), _text(f.get("payload", "")))
        for reply in replies
        for _, f in reply
    )
    stages, jobs = count_events(entries)
    minutes = THROUGHPUT_WINDOW_S / 60
    return {
        "window_s": THROUGHPUT_WINDOW_S,
        "truncated": truncated,
        "stages": [
            {
                "stage": s.value,
                "succeeded": stages[s.value],
                "per_minute": round(stages[s.value] / minutes, 2),
            }
            for s in PIPELINE
        ],
        "jobs": {k: jobs[k] for k in ("completed", "failed", "canceled")},
    }


async def _leases(
    redis: Redis, keys: KeySchema, group: str, partitions: int
) -> dict[str, list[dict[str, Any]]]:
    """Per consumer (worker process), the entries it holds per stream: its leases."""
    targets = [
        (p, stage, s)
        for p in range(partitions)
        for stage in ALL_STAGES
        for s in STREAMS
    ]  # fmt: skip
    pipe = redis.pipeline(transaction=False)
    for p, stage, s in targets:
        pipe.xinfo_consumers(keys.for_stage(stage.value).stream(p, s), group)
    replies = await pipe.execute(raise_on_error=False)
    out: dict[str, list[dict[str, Any]]] = {}
    for (p, stage, s), reply in zip(targets, replies, strict=True):
        if isinstance(reply, ResponseError):
            continue  # no such stream or group yet
        if isinstance(reply, Exception):
            raise reply
        for c in reply:
            pending = int(c.get("pending", 0))
            if pending:
                out.setdefault(_text(c.get("name", "")), []).append(
                    {
                        "partition": p,
                        "stage": stage.value,
                        "stream": s.value,
                        "leases": pending,
                        "idle_ms": int(c.get("idle", 0)),
                    }
                )
    return out


async def _workers(
    redis: Redis, keys: KeySchema, group: str, partitions: int
) -> list[dict[str, Any]]:
    """Every worker process seen by a fleet clock in the last ten minutes, with its card
    (while it keeps ticking) and its leases."""
    pipe = redis.pipeline(transaction=False)
    for p in range(partitions):
        pipe.zrange(keys.workers(p), 0, -1, withscores=True)
    last_seen: dict[str, int] = {}
    for reply in await pipe.execute():
        for name, score in reply:
            last_seen[_text(name)] = max(last_seen.get(_text(name), 0), int(score))
    names = sorted(last_seen)
    pipe = redis.pipeline(transaction=False)
    for name in names:
        pipe.get(keys.worker_card(name))
    cards = await pipe.execute() if names else []
    leases = await _leases(redis, keys, group, partitions)
    rows = []
    for name, card in zip(names, cards, strict=True):
        info = orjson.loads(card) if card else {}
        workers = info.get("workers", [])
        rows.append(
            {
                "name": name,
                "last_seen": rfc3339(last_seen[name]),
                "alive": bool(card),
                "host": info.get("host"),
                "pid": info.get("pid"),
                "started_at": rfc3339(info.get("started_at_ms")),
                "stages": [w.get("stage") or "job" for w in workers],
                "slots": sum(int(w.get("slots", 0)) for w in workers),
                "in_use": sum(int(w.get("in_use", 0)) for w in workers),
                "running": int(info.get("running", 0)),
                "leases": leases.get(name, []),
            }
        )
    return rows


async def _dead_letters(redis: Redis, keys: KeySchema, partitions: int) -> dict[str, int]:
    m = MaintenanceKeys(keys)
    kinds: Sequence[DeadLetterKind] = tuple(DeadLetterKind)
    pipe = redis.pipeline(transaction=False)
    for kind in kinds:
        for p in range(partitions):
            pipe.xlen(m.dead_letters(kind, p))
    counts = await pipe.execute()
    return {
        kind.value: sum(int(n) for n in counts[i * partitions : (i + 1) * partitions])
        for i, kind in enumerate(kinds)
    }


async def read_stats(redis: Redis, keys: KeySchema, settings: Settings) -> dict[str, Any]:
    group, partitions = settings.consumer_group, settings.partitions
    backlogs = await read_stage_backlogs(redis, keys, group, partitions)
    return {
        "generated_at": rfc3339(int(time.time() * 1000)),
        "partitions": partitions,
        "streams": stream_rows(backlogs),
        "throughput": await _throughput(redis, keys, partitions),
        "workers": await _workers(redis, keys, group, partitions),
        "dead_letters": await _dead_letters(redis, keys, partitions),
    }
