"""Redis I/O of webhook delivery: tenant secrets, messages (one per event and target), their
due set, attempt logs and dead letters. Thin calls over the wh_*.lua scripts; the delivery
policy lives in the dispatcher."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from redis.exceptions import ResponseError

from splatq.shared.backoff import Backoff
from splatq.shared.engine.backend import Backend, Role
from splatq.shared.engine.ids import is_job_id, new_event_id
from splatq.shared.engine.queue_types import DeadLetter, parse_dead_letter_id
from splatq.shared.engine.scripts import Arg, ScriptCall, new_request_id
from splatq.shared.redis.client import is_transient_reply
from splatq.shared.redis.replay import replay_key
from splatq.shared.webhooks.endpoints import EndpointStore, Health
from splatq.shared.webhooks.scripts import WebhookScript
from splatq.shared.webhooks.signing import generate_secret

DISPATCHER_GROUP = "dispatcher"
# The event POST /v1/webhook-endpoints/{id}/test sends: into the outbox like a job's events,
# with an `endpoint` field that makes the fan-out address that one endpoint only.
TEST_EVENT = "webhook.test"
LOG_CAP = 200
DLQ_INDEX_PAGE = 1_000
# How long recording an attempt's result keeps resending through a failover or a migration
# (the message stays claimed meanwhile; past this it becomes due again after its visibility
# timeout and is sent once more).
RECORD_RESEND_S = 10.0
# wh_claim_due.lua's reply: id, event_id, event_type, job_id, tenant, url, payload, target,
# attempts, per claimed message.
CLAIM_REPLY_STRIDE = 9
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
    target: str = "job"  # "job" (the job's webhook_url) or an endpoint id

    @property
    def endpoint_id(self) -> str:
        return "" if self.target == "job" else self.target


@dataclass(frozen=True, slots=True)
class AttemptResult:
    """One finished attempt (or a decision not to attempt), recorded by wh_result.lua; for an
    endpoint's message, `health` ('ok' | 'fail' | 'gone' | '') is folded into the endpoint by
    wh_ep_record.lua (wh_ep_health.lua's rules) in the same round trip."""

    message: Message
    outcome: str  # delivered | retry | deferred | dropped | failed
    delay_ms: int
    attempt: Mapping[str, Any] | None  # None: not an attempt, not logged
    reason: str = ""
    code: str = ""
    health: str = ""


@dataclass(frozen=True, slots=True)
class Recorded:
    """What recording a result changed: the message's status, and the endpoint's health."""

    status: str
    health: Health | None = None


def _endpoint_groups(
    results: Sequence[AttemptResult], attempts: Sequence[str]
) -> dict[tuple[str, str], tuple[list[str], list[str]]]:
    """Per (tenant, endpoint id): the health outcomes to fold in, in the order the results
    finished, and the attempt records (JSON) for its attempt log."""
    groups: dict[tuple[str, str], tuple[list[str], list[str]]] = {}
    for r, attempt in zip(results, attempts, strict=True):
        if not r.message.endpoint_id or not (r.health or attempt):
            continue
        outcomes, logged = groups.setdefault((r.message.tenant, r.message.endpoint_id), ([], []))
        if r.health:
            outcomes.append(r.health)
        if attempt:
            logged.append(attempt)
    return groups


def _attempt_json(r: AttemptResult) -> str:
    """The attempt record as logged ('' for a result that was no attempt)."""
    if r.attempt is None:
        return ""
    # orjson takes a dict, not any Mapping: the dispatcher's records are dicts already.
    return orjson.dumps(r.attempt if type(r.attempt) is dict else dict(r.attempt)).decode()


def _target_of(dead_letter: Mapping[str, str]) -> str:
    """A dead letter's target as Message.target names it (entries from before targets say
    nothing: the job's webhook_url)."""
    return dead_letter.get("target") or "job"


class WebhookStore:
    def __init__(self, store: Backend | Role) -> None:
        """Over the job store's backend (any role of it will do: its backend is taken)."""
        backend = store if isinstance(store, Backend) else store.backend
        self.scripts = backend.scripts
        self.scripts.register(WebhookScript)
        self.redis = backend.redis
        self.keys = backend.keys
        self.settings = backend.settings
        self.endpoints = EndpointStore(backend)

    async def setup(self) -> None:
        for p in range(self.settings.partitions):
            try:
                await self.redis.xgroup_create(
                    self.keys.events(p), DISPATCHER_GROUP, id="0", mkstream=True
                )
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
            await self.index_dead_letters(p)

    async def index_dead_letters(self, partition: int) -> int:
        """Index the partition's webhook dead letters by (tenant, target), as wh_result.lua
        does for new ones: once per partition (a marker), for those written before the
        index existed. The stream is capped (SPLATQ_DLQ_MAXLEN) and read in pages. Idempotent,
        and a member of an entry redriven meanwhile is dropped by wh_redrive.lua."""
        marker = self.keys.webhook_dead_letters_indexed(partition)
        if await self.redis.exists(marker):
            return 0
        dlq = self.keys.webhook_dead_letters(partition)
        ttl_ms = 2 * self.settings.job_retention_ms  # as wh_result.lua
        indexed, start = 0, "-"
        while True:
            entries = await self.redis.xrange(dlq, start, "+", count=DLQ_INDEX_PAGE)
            pipe = self.redis.pipeline(transaction=False)
            for entry_id, f in entries:
                index = self.keys.webhook_dead_letter_index(
                    partition, f.get("tenant", ""), _target_of(f)
                )
                score = int(entry_id.partition("-")[0])
                pipe.zadd(index, {f"{entry_id} {f.get('message', '')}": score})
                pipe.pexpire(index, ttl_ms)
            if entries:
                await pipe.execute()
            indexed += len(entries)
            if len(entries) < DLQ_INDEX_PAGE:
                break
            start = "(" + entries[-1][0]
        await self.redis.set(marker, "1")
        return indexed

    async def tenant_secret(self, tenant: str) -> str:
        """The tenant's signing secret, created on first use (SET NX: one wins)."""
        return (await self.tenant_secrets(tenant))[0]

    async def tenant_secrets(self, tenant: str) -> tuple[str, ...]:
        """The tenant's current secret (created on first use), then the previous one while a
        rotation's overlap lasts: every one of them signs. One round trip."""
        current = self.keys.tenant_webhook_secret(tenant)
        previous = self.keys.tenant_webhook_previous_secret(tenant)
        # Two GETs, not MGET: both keys share the tenant's slot, but redis-py's cluster
        # pipeline refuses MGET outright (RedisClusterException), whatever the slots.
        pipe = self.redis.pipeline(transaction=False)
        pipe.set(current, generate_secret(), nx=True)
        pipe.get(current)
        pipe.get(previous)
        _, secret, old = await pipe.execute()
        return (str(secret), str(old)) if old else (str(secret),)

    async def rotate_tenant_secret(self, tenant: str) -> str:
        """A new secret for the tenant's job webhook_urls; the old one keeps signing for the
        rotation overlap (SPLATQ_WEBHOOK_ROTATION_OVERLAP_S)."""
        keys = [
            self.keys.tenant_webhook_secret(tenant),
            self.keys.tenant_webhook_previous_secret(tenant),
        ]
        overlap_ms = self.settings.webhook_rotation_overlap_s * 1000
        reply = await self.scripts.run(
            ScriptCall(WebhookScript.WH_SECRET_ROTATE, keys, [generate_secret(), overlap_ms])
        )
        if isinstance(reply, Exception):
            raise reply
        return str(reply)

    async def previous_secret_expires_ms(self, tenant: str) -> int:
        """When the previous secret stops signing (epoch ms), or 0 when there is none."""
        ttl = await self.redis.pttl(self.keys.tenant_webhook_previous_secret(tenant))
        return int(time.time() * 1000) + int(ttl) if ttl and ttl > 0 else 0

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
            calls.append(ScriptCall(WebhookScript.WH_FANOUT, keys, args))
        created = 0
        for reply in await self.scripts.run_many(calls):
            if isinstance(reply, Exception):
                raise reply
            created += int(reply)
        return created

    async def send_test_event(self, tenant: str, endpoint_id: str) -> str:
        """Append a signed-when-sent `webhook.test` event for one endpoint to an outbox
        stream: the dispatcher fans it out, delivers it, retries it, logs its attempts and
        dead-letters it as any other event. Returns the event id."""
        event_id = new_event_id()
        payload = orjson.dumps({
            "event": TEST_EVENT, "id": event_id, "timestamp": int(time.time()),
            "data": {"endpoint_id": endpoint_id,
                     "message": "a test event, sent on request through the API"},
        }).decode()  # fmt: skip
        partition = random.randrange(self.settings.partitions)
        await self.redis.xadd(
            self.keys.events(partition),
            {"event_id": event_id, "type": TEST_EVENT, "job_id": "", "tenant": tenant,
             "trace_id": "", "payload": payload, "endpoint": endpoint_id},
            maxlen=self.settings.events_maxlen,
            approximate=True,
        )  # fmt: skip
        return event_id

    async def claim_due(self, partition: int, most: int, visibility_ms: int) -> list[Message]:
        """Claim up to `most` of the partition's due messages for one attempt each, oldest
        due first (`claim_due_with`, nothing beside)."""
        return (await self.claim_due_with(partition, most, visibility_ms))[0]

    async def claim_due_with(
        self,
        partition: int,
        most: int,
        visibility_ms: int,
        beside: Callable[[Sequence[str]], Sequence[ScriptCall]] | None = None,
    ) -> tuple[list[Message], list[Any]]:
        """Claim up to `most` of the partition's due messages for one attempt each, oldest
        due first: the candidates read from the due set, then one script call
        (wh_claim_due.lua: the due-time and status checks, the visibility timeout, the
        attempt count) with their hashes declared, so a slot in migration is refused, not
        misread. A lost reply is resent by the client with the same request id, and the
        script's own memo answers it with the same messages.

        `beside` makes read-only calls from the candidates' ids (the dispatcher's gate peeks)
        that go in the claim's round trip; their replies (or errors) come back in order."""
        due = self.keys.webhook_due(partition)
        now_ms = int(time.time() * 1000)
        ids = [str(m) for m in await self.redis.zrangebyscore(due, "-inf", now_ms, 0, most)]
        if not ids:
            return [], []
        request_id = new_request_id()
        claim = ScriptCall(
            WebhookScript.WH_CLAIM_DUE,
            [due, replay_key(due, request_id),
             *(self.keys.webhook_message(partition, i) for i in ids)],
            [visibility_ms, self.settings.script_replay_ttl_ms, *ids],
            request_id,
        )  # fmt: skip
        reply, *answers = await self.scripts.run_many([claim, *(beside(ids) if beside else ())])
        if isinstance(reply, Exception):
            raise reply
        messages = [
            Message(
                reply[i], partition, reply[i + 1], reply[i + 2], reply[i + 3], reply[i + 4],
                reply[i + 5], reply[i + 6].encode(), int(reply[i + 8]), reply[i + 7] or "job",
            )
            for i in range(0, len(reply), CLAIM_REPLY_STRIDE)
        ]  # fmt: skip
        return messages, answers

    async def record_many(self, results: Sequence[AttemptResult]) -> list[Recorded | Exception]:
        """Record many results in one round trip: one script call per partition
        (wh_result_batch.lua), then one per endpoint for its health and attempt log
        (wh_ep_record.lua); answer each
        message's new state, and for messages to endpoints the endpoint's new health (or
        the error, for that message alone)."""
        by_partition: dict[int, list[int]] = {}
        for i, r in enumerate(results):
            by_partition.setdefault(r.message.partition, []).append(i)
        attempts = [_attempt_json(r) for r in results]
        calls = [self._result_call(p, [(results[i], attempts[i]) for i in indices])
                 for p, indices in by_partition.items()]  # fmt: skip
        groups = _endpoint_groups(results, attempts)
        calls.extend(self.endpoints.record_call(t, e, o, a) for (t, e), (o, a) in groups.items())
        replies = await self._run_until_answered(calls, RECORD_RESEND_S)
        statuses: list[Any] = [None] * len(results)
        for indices, reply in zip(by_partition.values(), replies, strict=False):
            for n, i in enumerate(indices):
                # A whole call's error (the batch did not run) is each of its messages' error.
                statuses[i] = reply if isinstance(reply, Exception) else reply[n]
        health: dict[tuple[str, str], Health] = {}
        for (group, (outcomes, _)), reply in zip(
            groups.items(), replies[len(by_partition) :], strict=True
        ):
            if outcomes and not isinstance(reply, Exception):
                health[group] = EndpointStore.parse_health(reply)
        out: list[Recorded | Exception] = []
        for r, status in zip(results, statuses, strict=True):
            if isinstance(status, Exception):
                out.append(status)
            elif isinstance(status, list):  # {'error', why}: this message's Lua error alone
                out.append(ResponseError(f"wh_result: {status[1] if len(status) > 1 else ''}"))
            else:
                group = (r.message.tenant, r.message.endpoint_id)
                out.append(Recorded(str(status), health.get(group) if r.health else None))
        return out

    def _result_call(
        self, partition: int, results: Sequence[tuple[AttemptResult, str]]
    ) -> ScriptCall:
        """wh_result_batch.lua's call for results of one partition (one slot), each with its
        attempt record's JSON."""
        keys = [self.keys.webhook_due(partition), self.keys.webhook_dead_letters(partition)]
        s = self.settings
        args: list[Arg] = [LOG_CAP, s.dlq_maxlen, s.job_retention_ms]
        for r, attempt in results:
            m = r.message
            msg_key = self.keys.webhook_message(partition, m.id)
            of_job = is_job_id(m.job_id)
            job_log = self.keys.job_deliveries(m.job_id) if of_job else msg_key
            index = self.keys.webhook_dead_letter_index(partition, m.tenant, m.target)
            keys += (msg_key, job_log, index)
            args += (m.id, r.outcome, r.delay_ms, attempt, r.code, r.reason,
                     "1" if of_job else "0")  # fmt: skip
        return ScriptCall(WebhookScript.WH_RESULT_BATCH, keys, args)

    async def _run_until_answered(self, calls: Sequence[ScriptCall], budget_s: float) -> list[Any]:
        """run_many, resending the very same calls (same request ids: the replay memo
        answers any that ran) whose result was a lost connection or a 'not now' reply (a
        failover, a slot in migration), with backoff, for up to `budget_s`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + budget_s
        replies = await self.scripts.run_many(calls, resend_for_s=budget_s)
        backoff = Backoff()
        while True:
            again = [i for i, r in enumerate(replies) if isinstance(r, Exception)
                     and is_transient_reply(r)]  # fmt: skip
            if not again or loop.time() + backoff.delay_s > deadline:
                return replies
            await backoff.sleep()
            resent = await self.scripts.run_many([calls[i] for i in again])
            for i, reply in zip(again, resent, strict=True):
                replies[i] = reply

    # -- dead letters (operators) ----------------------------------------------------------

    async def dead_letters(self, partition: int, count: int = 10_000) -> list[DeadLetter]:
        entries = await self.redis.xrange(self.keys.webhook_dead_letters(partition), count=count)
        return [DeadLetter(partition, eid, dict(f)) for eid, f in entries]

    async def dead_letter(self, dlq_id: str) -> DeadLetter | None:
        partition, entry_id = parse_dead_letter_id(dlq_id)
        if partition >= self.settings.partitions:
            return None
        key = self.keys.webhook_dead_letters(partition)
        entries = await self.redis.xrange(key, entry_id, entry_id)
        return DeadLetter(partition, entries[0][0], dict(entries[0][1])) if entries else None

    async def redrive(self, letter: DeadLetter) -> tuple[str, str]:
        """Send a dead-lettered message again with a fresh attempt budget:
        (redriven | gone | not_redrivable, detail)."""
        message_id = letter.fields.get("message", "")
        if not message_id:
            return "not_redrivable", "entry names no message"
        redriven, expired, _ = await self.endpoints.redrive_messages(
            letter.partition,
            letter.fields.get("tenant", ""),
            _target_of(letter.fields),
            [(letter.entry_id, message_id)],
        )
        if redriven:
            return "redriven", message_id
        if expired:
            return "not_redrivable", "the message has expired (its payload is gone); purge it"
        return "gone", "already pending or delivered"

    async def purge_dead_letter(self, letter: DeadLetter) -> bool:
        """Delete the entry, then its index member. Not atomic, and need not be: a member
        left behind names an entry that is gone, which wh_redrive.lua drops unsent."""
        key = self.keys.webhook_dead_letters(letter.partition)
        purged = bool(await self.redis.xdel(key, letter.entry_id))
        f = letter.fields
        index = self.keys.webhook_dead_letter_index(
            letter.partition, f.get("tenant", ""), _target_of(f)
        )
        await self.redis.zrem(index, f"{letter.entry_id} {f.get('message', '')}")
        return purged

    async def deliveries(self, job_id: str) -> list[dict[str, Any]]:
        """The job's delivery attempts, oldest first."""
        key = self.keys.job_deliveries(job_id)
        raw = await self.redis.lrange(key, 0, LOG_CAP - 1)  # type: ignore[misc]
        return [orjson.loads(r) for r in reversed(raw)]
