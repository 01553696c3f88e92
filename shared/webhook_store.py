"""Redis I/O of webhook delivery: tenant secrets, messages (one per event and target), their
due set, attempt logs and dead letters. Thin calls over the wh_*.lua scripts; the delivery
policy lives in the dispatcher."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from redis.exceptions import ResponseError

from shared.jobs import pairs_to_dict
from shared.queue import JOB_RETENTION_MS, JobQueue
from shared.scripts import Arg, Script, ScriptCall
from shared.webhook_signing import generate_secret

DISPATCHER_GROUP = "dispatcher"
LOG_CAP = 200
MESSAGE_FIELDS = ("event_id", "event_type", "job_id", "tenant", "url", "payload", "target",
                  "created_ms")  # fmt: skip


@dataclass(frozen=True, slots=True)
class Message:
    """One (event, target) delivery as the dispatcher claims it."""

    id: str
    partition: int
    event_id: str
    event_type: str
    job_id: str
    tenant: str
    url: str
    payload: bytes
    attempts: int


@dataclass(frozen=True, slots=True)
class AttemptResult:
    """One finished attempt, to be recorded by wh_result.lua."""

    message: Message
    outcome: str
    delay_ms: int
    attempt: Mapping[str, Any]
    reason: str


class WebhookStore:
    def __init__(self, queue: JobQueue) -> None:
        self.queue = queue
        self.redis = queue.redis
        self.keys = queue.keys
        self.settings = queue.settings

    async def setup(self) -> None:
        for p in range(self.settings.partitions):
            try:
                await self.redis.xgroup_create(
                    self.keys.events(p), DISPATCHER_GROUP, id="0", mkstream=True
                )
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    async def tenant_secret(self, tenant: str) -> str:
        """The tenant's signing secret, created on first use (SET NX: one wins)."""
        key = self.keys.tenant_webhook_secret(tenant)
        await self.redis.set(key, generate_secret(), nx=True)
        return str(await self.redis.get(key))

    async def fan_out(
        self, partition: int, batch: Sequence[tuple[str, Sequence[Mapping[str, str]]]]
    ) -> int:
        """For each (events entry id, its messages): create the messages (idempotent) and
        ack the entry. One round trip for the whole batch; returns messages created."""
        calls = []
        for entry_id, messages in batch:
            keys = [self.keys.events(partition), self.keys.webhook_due(partition)]
            args: list[Arg] = [DISPATCHER_GROUP, entry_id]
            for m in messages:
                keys.append(self.keys.webhook_message(partition, m["id"]))
                args.append(m["id"])
                args.extend(m[name] for name in MESSAGE_FIELDS)
            calls.append(ScriptCall(Script.WH_FANOUT, keys, args))
        created = 0
        for reply in await self.queue.scripts.run_many(calls):
            if isinstance(reply, Exception):
                raise reply
            created += int(reply)
        return created

    async def due(self, partition: int, now_ms: int, limit: int) -> list[str]:
        members = await self.redis.zrangebyscore(
            self.keys.webhook_due(partition), "-inf", now_ms, start=0, num=limit
        )
        return [str(m) for m in members]

    async def claim(
        self, partition: int, message_ids: Sequence[str], visibility_ms: int
    ) -> list[Message]:
        calls = [
            ScriptCall(
                Script.WH_CLAIM,
                [self.keys.webhook_due(partition), self.keys.webhook_message(partition, mid)],
                [mid, visibility_ms],
            )
            for mid in message_ids
        ]
        out: list[Message] = []
        for mid, reply in zip(message_ids, await self.queue.scripts.run_many(calls), strict=True):
            if isinstance(reply, Exception):
                raise reply
            if reply[0] != "claimed":
                continue
            f = pairs_to_dict(reply[1:])
            out.append(
                Message(
                    mid,
                    partition,
                    f["event_id"],
                    f["event_type"],
                    f["job_id"],
                    f["tenant"],
                    f["url"],
                    f["payload"].encode(),
                    int(f["attempts"]),
                )
            )
        return out

    async def record_many(self, results: Sequence[AttemptResult]) -> list[str | Exception]:
        """Record many attempts in one round trip; each message's new status (or the error)."""
        calls = []
        for r in results:
            p = r.message.partition
            calls.append(ScriptCall(
                Script.WH_RESULT,
                [self.keys.webhook_due(p), self.keys.webhook_message(p, r.message.id),
                 self.keys.job_deliveries(r.message.job_id), self.keys.webhook_dead_letters(p)],
                [r.message.id, r.outcome, r.delay_ms, orjson.dumps(dict(r.attempt)).decode(),
                 LOG_CAP, self.settings.dlq_maxlen, JOB_RETENTION_MS, r.reason],
            ))  # fmt: skip
        replies = await self.queue.scripts.run_many(calls)
        return [r if isinstance(r, Exception) else str(r) for r in replies]

    async def deliveries(self, job_id: str) -> list[dict[str, Any]]:
        """The job's delivery attempts, oldest first."""
        key = self.keys.job_deliveries(job_id)
        raw = await self.redis.lrange(key, 0, LOG_CAP - 1)  # type: ignore[misc]
        return [orjson.loads(r) for r in reversed(raw)]
