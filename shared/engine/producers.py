"""The producers' role: route and enqueue jobs, claim logical keys (single-flight and
Idempotency-Keys), read a job and its history, cancel, and the token buckets that rate-limit
submissions (the gateway, the client library, the CLI)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence

from splatq.shared.engine import events, history
from splatq.shared.engine.backend import Role
from splatq.shared.engine.claims import Claim, answering, claim_partitions, is_live, parse_claim
from splatq.shared.engine.events import EventType
from splatq.shared.engine.fairness import TenantPolicy, fairness_of, home_partition
from splatq.shared.engine.ids import new_event_id, new_job_id, new_trace_id, partition_of
from splatq.shared.engine.jobs import JobSpec
from splatq.shared.engine.queue_types import (
    ClaimResult,
    EnqueueResult,
    delayed_member,
    parse_job_reply,
    raise_on_error,
)
from splatq.shared.engine.replies import Reply
from splatq.shared.engine.scripts import Arg, Script, ScriptCall

# How long a watcher's registration outlives its blocking read (ms).
HISTORY_WATCH_GRACE_MS = 5_000


class Producers(Role):
    def route(self, tenant: str, logical_key: str, policy: TenantPolicy | None = None) -> int:
        """The partition of a new job and of its claim: a capped tenant's home partition
        (its cap is then one counter in one slot), else the logical key's, else any."""
        if policy is not None and policy.max_running > 0 and self.settings.fair_scheduling:
            return home_partition(tenant, self.settings.partitions)
        if logical_key:
            return self.keys.partition_for(logical_key)
        return random.randrange(self.settings.partitions)

    def new_job_id(self, spec: JobSpec, policy: TenantPolicy | None = None) -> str:
        """A fresh id for `spec`'s job in the partition `enqueue` routes it to (under the same
        `policy`): a caller that must record something under the id before the job exists
        (a quota reservation) passes it to `enqueue(job_id=...)`."""
        if policy is None:
            policy = fairness_of(self.settings).policy(spec.tenant, spec.stream)
        return new_job_id(self.route(spec.tenant, spec.idempotency_key, policy))

    async def enqueue(
        self,
        spec: JobSpec,
        max_backlog: int = 0,
        max_tenant_backlog: int = 0,
        policy: TenantPolicy | None = None,
        job_id: str = "",
        join_only: bool = False,
    ) -> EnqueueResult:
        """Create the job and put it in line in one script; returns once Redis has it. With
        fair scheduling (the default) it waits in its tenant's queue under `policy` (the
        Settings defaults when None) until a worker's take moves it into the stream. With
        `max_backlog`, a stream partition holding that many jobs refuses new work
        (`overloaded`); with `max_tenant_backlog`, so does a tenant with that many unfinished
        jobs in it. A repeat of a claimed key still gets its job either way. `job_id`, when
        given, must come from `new_job_id(spec)` and be used once. `join_only`: answer the
        job holding the spec's claim key, or `not_joined`, never create one (the caller holds
        nothing a new job would need: a quota reservation)."""
        stream = spec.stream
        fairness = fairness_of(self.settings)
        if policy is None:
            policy = fairness.policy(spec.tenant, stream)
        partition = self.route(spec.tenant, spec.idempotency_key, policy)
        fair_arg = fairness.argument(spec.quality, policy, self.group) if fairness.enabled else ""
        if (
            job_id
            and partition_of(job_id) != partition
            and (spec.idempotency_key or (policy.max_running > 0 and self.settings.fair_scheduling))
        ):
            raise ValueError(f"{job_id} is not in the partition its job is routed to")
        job_id = job_id or new_job_id(partition)
        partition = partition_of(job_id)
        if spec.idempotency_key:
            # The key may be held where another route put it (the tenant's cap changed since):
            # a live claim there answers; this partition's is checked by the script itself.
            held = await self._claim_elsewhere(spec.tenant, spec.idempotency_key, partition)
            if held is not None:
                return EnqueueResult(job_id=held[1], created=False, claim_status=held[0])
        keys = [
            self.keys.job(job_id),
            self.keys.stream(partition, stream),
            self.keys.events(partition),
        ]
        if spec.idempotency_key:
            keys.append(self.keys.idempotency(partition, self.keys.digest(spec.idempotency_key)))
        fields = spec.hash_fields()
        if not fields["trace_id"]:
            fields["trace_id"] = new_trace_id()
        args: list[Arg] = [
            job_id,
            new_event_id(),
            self.settings.stream_maxlen,
            self.settings.events_maxlen,
            self._claim_ttl_ms,
            EventType.QUEUED.value,
            events.queued_fields(spec.quality, stream.value),
            max_backlog,
            max_tenant_backlog,
            fair_arg,
            "join" if join_only else "",
        ]
        for name, value in fields.items():
            args.extend((name, value))
        reply = await self.scripts.run(ScriptCall(Script.ENQUEUE, keys, args))
        raise_on_error(reply)
        outcome = reply[0]
        if outcome == Reply.CREATED:
            # what it sent, then what the script assigned (numbers come back as integers)
            job, _ = parse_job_reply([str(a) for a in (*args[11:], *reply[3:])])
            return EnqueueResult(job_id=reply[1], created=True, job=job)
        if outcome == Reply.DUPLICATE:
            return EnqueueResult(job_id=reply[1], created=False, claim_status=reply[2])
        if outcome == Reply.NOT_JOINED:
            return EnqueueResult(job_id="", created=False, not_joined=True)
        if outcome == Reply.OVERLOADED:
            return EnqueueResult(
                job_id="",
                created=False,
                overloaded=True,
                backlog=int(reply[1]),
                overload_scope=str(reply[2]),
            )
        # 'exists': the id is fresh and ours, so only our own first execution can have made
        # it -- a resend past the replay memo. Answer what that execution did.
        job = await self.get(job_id)
        if job is None:
            raise RuntimeError(f"enqueue of {job_id} answered 'exists' but the job is gone")
        return EnqueueResult(job_id=job_id, created=True, job=job)

    async def _claims(self, logical_key: str, places: Sequence[int]) -> dict[int, Claim | None]:
        """What the claim key of `logical_key` holds in each of `places`, one round trip."""
        digest = self.keys.digest(logical_key)
        # Concurrent single GETs, not a pipeline: the places are in different slots, and on a
        # cluster a lone command follows MOVED/ASK redirects (a slot in migration) by itself.
        replies = await asyncio.gather(
            *(self.redis.get(self.keys.idempotency(partition, digest)) for partition in places)
        )
        return {p: parse_claim(raw) for p, raw in zip(places, replies, strict=True)}

    async def _claim_elsewhere(self, tenant: str, logical_key: str, routed: int) -> Claim | None:
        """A live claim of `logical_key` in a place it may live in (shared/engine/claims.py)
        other than the partition it is routed to now, if any."""
        places = [p for p in claim_partitions(self.keys, tenant, logical_key) if p != routed]
        if not places:
            return None
        held = [c for c in (await self._claims(logical_key, places)).values() if is_live(c)]
        return held[0] if held else None

    async def claim(
        self, logical_key: str, job_id: str, policy: TenantPolicy | None = None, tenant: str = ""
    ) -> ClaimResult:
        """Claim a logical key for `job_id` (one winner among concurrent claimers); a live
        claim of the key in its other place (another route's) wins over it."""
        # The key's own partition, as enqueue and claim_status use (not the job id's).
        partition = self.route(tenant, logical_key, policy)
        held = await self._claim_elsewhere(tenant, logical_key, partition)
        if held is not None:
            return ClaimResult(won=False, status=held[0], job_id=held[1])
        key = self.keys.idempotency(partition, self.keys.digest(logical_key))
        reply = await self.scripts.run(
            ScriptCall(Script.CLAIM, [key], [job_id, self._claim_ttl_ms])
        )
        raise_on_error(reply)
        return ClaimResult(won=reply[0] == 1, status=reply[1], job_id=reply[2])

    async def claim_status(
        self, logical_key: str, policy: TenantPolicy | None = None, tenant: str = ""
    ) -> tuple[str, str] | None:
        """(status, job_id) of a logical key's claim, or None when unclaimed/expired. Pass the
        `tenant`: a claim made while the tenant had a running cap lives in its home partition,
        one made without in the key's own, and both are read (a live one answers; the
        partition `policy` routes to now is preferred)."""
        places = claim_partitions(self.keys, tenant, logical_key)
        found = await self._claims(logical_key, places)
        return answering(found, self.route(tenant, logical_key, policy))

    async def job_history(
        self,
        job_id: str,
        after: str = history.START,
        block_ms: int | None = None,
        count: int = 100,
    ) -> list[tuple[str, str, str]]:
        """(SSE id, event type, payload JSON) of the job's events after `after`; with
        `block_ms`, waits that long for one when there is none yet (woken by the next event,
        not by polling). Empty when the job does not exist."""
        events, wake_id = await self._history(job_id, after, block_ms or 0, count)
        if events or not block_ms:
            return events
        # history.lua registered this reader as a watcher and answered the wake stream's last
        # id in the same step, so an event appended since then wakes this read. (A job that
        # is gone answers no id: the read then just waits out its time, as a reader's loop
        # expects of a blocking read.)
        await self.redis.xread(
            {self.keys.job_wake(job_id): wake_id or "$"}, count=1, block=block_ms
        )
        events, _ = await self._history(job_id, after, 0, count)
        return events

    async def _history(
        self, job_id: str, after: str, watch_ms: int, count: int
    ) -> tuple[list[tuple[str, str, str]], str]:
        ms, seq = history.split_id(after)
        # The watch outlives the blocking read a little, so an event between this call and
        # the read still wakes it; the next call extends it.
        watch = watch_ms + HISTORY_WATCH_GRACE_MS if watch_ms else 0
        reply = await self.scripts.run(
            ScriptCall(
                Script.HISTORY,
                [
                    self.keys.job(job_id),
                    self.keys.job_history(job_id),
                    self.keys.job_wake(job_id),
                    self.keys.job_events(job_id),
                ],
                [ms, seq, watch, count],
            )
        )
        raise_on_error(reply)
        if not reply:
            return [], ""
        events = [(e.id, e.type, e.payload) for e in history.decode(reply)]
        return events, str(reply[2])

    async def cancel(self, job_id: str, tenant: str = "") -> str:
        """not_found | already_finished | cancel_requested | canceled."""
        job = await self.get(job_id)
        if job is None:
            return "not_found"
        partition = partition_of(job_id)
        keys = [self.keys.job(job_id), self.keys.delayed(partition), self.keys.events(partition)]
        if job.claim_key:
            keys.append(job.claim_key)
        reply = await self.scripts.run(
            ScriptCall(
                Script.CANCEL,
                keys,
                [
                    new_event_id(),
                    self.settings.events_maxlen,
                    EventType.CANCELED.value,
                    self.settings.job_retention_ms,
                    self._claim_ttl_ms,
                    tenant,
                    delayed_member(job.stream, job_id, self._stage_key_of(job.current_stage)),
                ],
            )
        )
        raise_on_error(reply)
        return str(reply[0])

    async def take_tokens(
        self, tenant: str, rate_per_s: float, burst: int, cost: int = 1, bucket: str = ""
    ) -> tuple[bool, int]:
        """Per-tenant token bucket (one per `bucket` name): (allowed, retry_after_ms)."""
        key = self.keys.rate_limit(tenant, bucket)
        reply = await self.scripts.run(
            ScriptCall(Script.RATE_LIMIT, [key], [rate_per_s, burst, cost])
        )
        raise_on_error(reply)
        return bool(reply[0]), int(reply[1])
