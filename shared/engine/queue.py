"""The engine's Redis I/O: every read and write of jobs, streams, leases and claims.

A thin layer over the Lua scripts (`shared/engine/lua/`); policy (what to retry, when to reap)
lives with its callers. Every multi-key call stays in one `{pN}` slot.
"""

from __future__ import annotations

import asyncio
import copy
import random
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from splatq.shared.engine import events
from splatq.shared.engine.claims import Claim, answering, claim_partitions, is_live, parse_claim
from splatq.shared.engine.events import EventType
from splatq.shared.engine.fairness import TenantPolicy, fairness_of, home_partition
from splatq.shared.engine.ids import is_job_id, new_event_id, new_job_id, new_trace_id, partition_of
from splatq.shared.engine.jobs import JOB_FORMAT_VERSION, JobRecord, JobSpec, pairs_to_dict
from splatq.shared.engine.keys import STREAMS, KeySchema, StreamName
from splatq.shared.engine.scripts import Arg, Script, ScriptCall, ScriptRunner, new_request_id
from splatq.shared.engine.stages import FIRST_STAGE, PipelineStage, next_stage
from splatq.shared.redis.client import is_transient_reply
from splatq.shared.redis.replay import replay_key
from splatq.shared.settings import Settings

# Parking consumer for released entries: they stay pending (keeping their place) until a
# reaper pass hands them to a worker with free slots.
PARKING_CONSUMER = "splatq-parking"
# renew_many's answer for a lease whose renewal got an error reply (neither kept nor lost).
RENEW_UNKNOWN = -1


@dataclass(frozen=True, slots=True)
class StreamEntry:
    partition: int
    stream: StreamName
    entry_id: str
    fields: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class EnqueueResult:
    job_id: str
    created: bool
    # For a duplicate: the claim's status (PENDING/PROCESSING/COMPLETED) of the existing job.
    claim_status: str = "PENDING"
    # Refused because the stream partition already holds `max_backlog` entries (scope
    # 'stream'), or the tenant already has `max_tenant_backlog` unfinished jobs in it
    # (scope 'tenant').
    overloaded: bool = False
    backlog: int = 0
    overload_scope: str = ""
    # The new job's record (created only), read in the same script.
    job: JobRecord | None = None
    # join_only, and the key's claim was no longer live: nothing was created.
    not_joined: bool = False


@dataclass(frozen=True, slots=True)
class ClaimResult:
    won: bool
    status: str
    job_id: str


@dataclass(frozen=True, slots=True)
class StartResult:
    """Outcome of start.lua: `started` carries the job; the others say why not."""

    outcome: str  # started | corrupt | dead_lettered | error | unknown | skip | stale | busy
    job: JobRecord | None = None
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Taken:
    """One entry read by take.lua: started (with its job and lease token), raw (unparsed:
    for the caller to validate and dead-letter), or skip/stale/busy."""

    entry: StreamEntry
    outcome: str  # started | corrupt | raw | dead_lettered | skip | stale | busy
    job: JobRecord | None = None
    token: str = ""
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Finish:
    """A worker's request to leave `processing` (see finish.lua)."""

    job_id: str
    stream: StreamName
    entry_id: str
    token: str
    target: str
    claim_key: str = ""
    event: str = ""
    event_extra: str = ""
    retry_delay_ms: int = 0
    claim_status: str = ""
    handoff: bool = False
    fields: Mapping[str, str] | None = None
    # Fixed when the outcome is decided: every resend of this commit is the same call.
    request_id: str = field(default_factory=new_request_id)
    # A `failed` exit also dead-lettered under this reason (a redrive policy acts on it).
    dead_letter: str = ""


@dataclass(frozen=True, slots=True)
class Advance:
    """A stage run's request to move its job on to the next stage (see advance.lua)."""

    job_id: str
    stream: StreamName
    entry_id: str
    token: str
    stage: str
    next_stage: str
    record: str  # the finished stage's ledger record (JSON)
    progress: float
    event_extra: str
    fields: Mapping[str, str] | None = None
    also_event: str = ""
    also_extra: str = ""
    request_id: str = field(default_factory=new_request_id)


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One entry of a partition's job dead-letter stream."""

    partition: int
    entry_id: str
    fields: Mapping[str, str]

    @property
    def id(self) -> str:
        """Operator-facing id: `<partition>/<entry id>`."""
        return f"{self.partition}/{self.entry_id}"

    @property
    def reason(self) -> str:
        return self.fields.get("reason", "")

    @property
    def job_id(self) -> str:
        return self.fields.get("job") or self.fields.get("raw_job", "")

    @property
    def at_ms(self) -> int:
        raw = self.fields.get("at_ms", "")
        return int(raw) if raw.isdigit() else int(self.entry_id.split("-", 1)[0])


@dataclass(frozen=True, slots=True)
class StreamStats:
    partition: int
    stream: StreamName
    length: int
    pending: int
    lag: int | None
    oldest_pending_age_s: float
    consumers: int
    # The oldest entry no worker has been handed yet (0.0 when none waits).
    oldest_waiting_age_s: float = 0.0


@dataclass(frozen=True, slots=True)
class WaitingStats:
    """Jobs in line in one stream of a partition: waiting in the tenants' fair queues, and
    in the stream itself (ready or running)."""

    waiting: int
    in_stream: int
    oldest_waiting_age_s: float  # 0.0 when nothing waits

    @property
    def in_line(self) -> int:
        return self.waiting + self.in_stream


def delayed_member(stream: StreamName, job_id: str, stage: str = "") -> str:
    """The retry set's member of a job: '<class>|<id>' for the entry stage, and
    '<stage>:<class>|<id>' for a later pipeline stage (promote_due puts it back there)."""
    if stage:
        return f"{stage}:{stream.value}|{job_id}"
    return f"{stream.value}|{job_id}"


def parse_delayed_member(member: str) -> tuple[str, StreamName, str]:
    """(stage, class, job id) of a retry set member; raises ValueError on a foreign one."""
    lane, _, job_id = member.partition("|")
    stage, _, name = lane.rpartition(":")
    return stage, StreamName(name), job_id


def _entry_age_s(entry_id: str, now_ms: int) -> float:
    return max(0.0, (now_ms - int(entry_id.split("-", 1)[0])) / 1000.0)


class JobQueue:
    """Producer, consumer and operator operations on the job streams of one deployment."""

    def __init__(self, redis: Redis, settings: Settings) -> None:
        self.redis = redis
        self.settings = settings
        self.keys = KeySchema(partitions=settings.partitions)
        self.scripts = ScriptRunner(redis, settings.script_replay_ttl_ms, settings.job_retention_ms)
        self.group = settings.consumer_group
        self._claim_ttl_ms = settings.idempotency_ttl_s * 1000

        # The pipeline stage whose streams this queue reads; None = a monolithic worker's
        # queue (the entry streams, whole jobs).
        self.stage: PipelineStage | None = None

    def for_stage(self, stage: PipelineStage) -> JobQueue:
        """This queue (same connection and scripts) reading the work streams of `stage`."""
        other = copy.copy(self)
        other.keys = self.keys.for_stage(stage.value)
        other.stage = stage
        return other

    async def setup(self) -> None:
        """Load scripts and create every consumer group (idempotent; safe on every start)."""
        await self.scripts.load()
        for partition in range(self.settings.partitions):
            for stream in STREAMS:
                try:
                    await self.redis.xgroup_create(
                        self.keys.stream(partition, stream), self.group, id="0", mkstream=True
                    )
                except ResponseError as exc:
                    if "BUSYGROUP" not in str(exc):
                        raise

    # -- producers ---------------------------------------------------------------------

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
        _raise_on_error(reply)
        outcome = reply[0]
        if outcome == "created":
            job, _ = _parse_job(reply[3:])
            return EnqueueResult(job_id=reply[1], created=True, job=job)
        if outcome == "duplicate":
            return EnqueueResult(job_id=reply[1], created=False, claim_status=reply[2])
        if outcome == "not_joined":
            return EnqueueResult(job_id="", created=False, not_joined=True)
        if outcome == "overloaded":
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
        _raise_on_error(reply)
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
        self, job_id: str, after: str = "0-0", block_ms: int | None = None, count: int = 100
    ) -> list[tuple[str, str, str]]:
        """(entry id, event type, payload JSON) of the job's events after `after`."""
        reply = await self.redis.xread(
            {self.keys.job_events(job_id): after}, count=count, block=block_ms
        )
        out: list[tuple[str, str, str]] = []
        for _, entries in reply or []:
            out.extend((eid, f["type"], f["payload"]) for eid, f in entries)
        return out

    async def get(self, job_id: str) -> JobRecord | None:
        raw: dict[str, str] = await self.redis.hgetall(self.keys.job(job_id))  # type: ignore[misc]
        return JobRecord.from_hash(raw) if raw else None

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
        _raise_on_error(reply)
        return str(reply[0])

    # -- consumers ---------------------------------------------------------------------

    def _entry_claim_keys(self, entry: StreamEntry) -> list[str]:
        claim = entry.fields.get("claim", "")
        # Only a key of this entry's own slot is accepted; anything else is ignored.
        return [claim] if claim.startswith(self.keys.tag(entry.partition) + ":idem:") else []

    async def start_many(
        self,
        entries: Sequence[StreamEntry],
        tokens: Sequence[str],
        consumer: str,
        resend_for_s: float = 0.0,
        running: int = 0,
    ) -> list[StartResult]:
        """Take the leases and move the jobs to processing (one round trip for all)."""
        calls = []
        for entry, token in zip(entries, tokens, strict=True):
            job_id = entry.fields["job"]
            calls.append(
                ScriptCall(
                    Script.START,
                    [
                        self.keys.job(job_id),
                        self.keys.lease(job_id),
                        self.keys.events(entry.partition),
                        self.keys.stream(entry.partition, entry.stream),
                        *self._entry_claim_keys(entry),
                    ],
                    [
                        token,
                        self.settings.lease_ttl_ms,
                        consumer,
                        entry.entry_id,
                        self.group,
                        new_event_id(),
                        self.settings.events_maxlen,
                        EventType.STARTED.value,
                        self._claim_ttl_ms,
                        EventType.FAILED.value,
                        max(running, len(entries)),
                        self.settings.dlq_maxlen,
                        self.stage.value if self.stage is not None else "",
                    ],
                )
            )
        results: list[StartResult] = []
        for reply in await self.scripts.run_many(calls, resend_for_s):
            if isinstance(reply, Exception):
                # An error reply (OOM, READONLY, a script error) concerns this entry alone:
                # it stays pending and the reaper offers it again later.
                results.append(StartResult("error", detail=f"{type(reply).__name__}: {reply}"))
                continue
            outcome = str(reply[0])
            if outcome == "started":
                job, problem = _parse_job(reply[1:])
                results.append(StartResult("started" if job else "corrupt", job, problem))
            else:
                results.append(StartResult(outcome, detail=str(reply[1]) if len(reply) > 1 else ""))
        return results

    async def take(
        self,
        partition: int,
        own: Mapping[StreamName, int],
        idle: int,
        consumer: str,
        resend_for_s: float = 0.0,
        running: int = 0,
    ) -> list[Taken]:
        """Read and start up to the free slots' worth of new entries in one round trip."""
        nonce = f"{secrets.token_hex(8)}:"
        request_id = new_request_id()
        first_key = self.keys.stream(partition, StreamName.INTERACTIVE)
        reply = await self.scripts.run(
            ScriptCall(
                Script.TAKE,
                [
                    first_key,
                    self.keys.stream(partition, StreamName.SYNTHESIS),
                    self.keys.events(partition),
                    replay_key(first_key, request_id),
                ],
                [
                    self.group,
                    consumer,
                    own.get(StreamName.INTERACTIVE, 0),
                    own.get(StreamName.SYNTHESIS, 0),
                    idle,
                    self.settings.lease_ttl_ms,
                    nonce,
                    self.settings.events_maxlen,
                    EventType.STARTED.value,
                    self._claim_ttl_ms,
                    self.keys.tag(partition),
                    new_event_id(),
                    JOB_FORMAT_VERSION,
                    EventType.FAILED.value,
                    self.settings.script_replay_ttl_ms,
                    running,
                    self.settings.dlq_maxlen,
                    fairness_of(self.settings).quantum,
                    self.settings.stream_maxlen,
                    "0" if self.keys.stage else "1",  # only the entry streams are fed fairly
                    *self._downstream(partition),
                    self.stage.value if self.stage is not None else "",
                ],
                request_id,
            ),
            resend_for_s,
        )
        _raise_on_error(reply)
        taken: list[Taken] = []
        for stream_name, entry_id, outcome, payload in reply:
            stream = StreamName(stream_name)
            if outcome == "held":
                taken.append(Taken(StreamEntry(partition, stream, "", {}), outcome))
            elif outcome == "started":
                job, problem = _parse_job(payload)
                raw = pairs_to_dict(payload)
                entry = StreamEntry(
                    partition,
                    stream,
                    entry_id,
                    {"job": raw["id"], "claim": raw.get("claim_key", "")},
                )
                if job is None:
                    taken.append(Taken(entry, "corrupt", None, nonce + entry_id, problem))
                else:
                    taken.append(Taken(entry, outcome, job, nonce + entry_id))
            elif outcome == "raw":
                taken.append(
                    Taken(StreamEntry(partition, stream, entry_id, pairs_to_dict(payload)), outcome)
                )
            elif outcome == "dead_lettered":
                taken.append(
                    Taken(StreamEntry(partition, stream, entry_id, {}), outcome, detail=payload[0])
                )
            else:
                taken.append(Taken(StreamEntry(partition, stream, entry_id, {}), outcome))
        return taken

    async def renew_many(
        self,
        leases: Sequence[tuple[str, StreamName, str, str]],
        consumer: str,
        running: int = 0,
    ) -> list[int]:
        """Renew (job_id, stream, entry_id, token) leases: 0 lost, 1 ok, 2 cancel requested,
        -1 unknown (an error reply for that lease alone: it is tried again next tick).
        `running`: the jobs the consumer's process runs (`co_running`; at least the leases)."""
        calls = [
            ScriptCall(
                Script.RENEW,
                [
                    self.keys.lease(job_id),
                    self.keys.job(job_id),
                    self.keys.stream(partition_of(job_id), stream),
                ],
                [
                    token,
                    self.settings.lease_ttl_ms,
                    self.group,
                    consumer,
                    entry_id,
                    max(running, len(leases)),
                ],
            )
            for job_id, stream, entry_id, token in leases
        ]
        replies = await self.scripts.run_many(calls)
        return [RENEW_UNKNOWN if isinstance(r, Exception) else int(r) for r in replies]

    async def report_progress(
        self, job_id: str, token: str, progress: float, stage: str, emit: bool
    ) -> int:
        partition = partition_of(job_id)
        reply = await self.scripts.run(
            ScriptCall(
                Script.PROGRESS,
                [self.keys.job(job_id), self.keys.lease(job_id), self.keys.events(partition)],
                [
                    token,
                    progress,
                    stage,
                    "1" if emit else "0",
                    new_event_id(),
                    self.settings.events_maxlen,
                    EventType.PROGRESS.value,
                    events.progress_fields(progress, stage),
                ],
            )
        )
        _raise_on_error(reply)
        return int(reply)

    async def finish_many(self, requests: Sequence[Finish]) -> list[tuple[str, str]]:
        """Commit many exits from processing in one round trip; (outcome, status) each, or
        ('transient', why) for an error reply worth resending (OOM, READONLY) and ('error',
        why) for one that is not."""
        calls = []
        for f in requests:
            partition = partition_of(f.job_id)
            keys = [
                self.keys.job(f.job_id),
                self.keys.lease(f.job_id),
                self.keys.stream(partition, f.stream),
                self.keys.events(partition),
                self.keys.delayed(partition),
            ]
            if f.claim_key:
                keys.append(f.claim_key)
            if f.dead_letter:
                keys.append(self.keys.dead_letters(partition))
            args: list[Arg] = [
                f.token,
                f.entry_id,
                self.group,
                f.target,
                f.event,
                new_event_id(),
                self.settings.events_maxlen,
                f.event_extra,
                self.settings.job_retention_ms,
                f.retry_delay_ms,
                delayed_member(f.stream, f.job_id, self.keys.stage),
                f.claim_status,
                # Jittered, so the cached results of a burst do not all expire together.
                int(self._claim_ttl_ms * random.uniform(0.9, 1.0)),
                "handoff" if f.handoff else "ack",
                PARKING_CONSUMER,
                self.settings.lease_ttl_ms + 1,
                EventType.CANCELED.value,
                f.request_id,
                f.dead_letter,
                self.settings.dlq_maxlen,
            ]
            for name, value in (f.fields or {}).items():
                args.extend((name, value))
            calls.append(ScriptCall(Script.FINISH, keys, args, f.request_id))
        out = []
        for reply in await self.scripts.run_many(calls):
            if isinstance(reply, Exception):  # one bad call must not fail its batch-mates
                out.append(("transient" if is_transient_reply(reply) else "error", str(reply)))
            else:
                out.append((str(reply[0]), str(reply[1]) if len(reply) > 1 else ""))
        return out

    def _downstream(self, partition: int) -> list[Arg]:
        """take.lua's backpressure arguments: the next stage's stream key without its class,
        and how many entries it may hold per class (a monolithic or last stage: none)."""
        bound = self.settings.stage_buffer
        after = next_stage(self.stage) if self.stage is not None else None
        if not bound or after is None:
            return ["", 0]
        key = self.keys.stage_stream(partition, after.value, StreamName.INTERACTIVE)
        return [key[: -len(StreamName.INTERACTIVE.value)], bound]

    @staticmethod
    def _stage_key_of(current_stage: str) -> str:
        """The stage part of keys for a job in `current_stage` ('' = the entry streams)."""
        return "" if current_stage in ("", FIRST_STAGE.value) else current_stage

    async def advance(self, a: Advance) -> tuple[str, str]:
        """Commit a stage run's success and queue the job on the next stage (advance.lua):
        ('ok', next entry id) | ('lease_lost', '') | ('cancel_requested', '') |
        ('illegal', status) | ('transient', why) | ('error', why)."""
        partition = partition_of(a.job_id)
        options: dict[str, Any] = {
            "stage": a.stage,
            "next": a.next_stage,
            "record": a.record,
            "progress": a.progress,
            "event_id": new_event_id(),
            "event": EventType.PROGRESS.value,
            "extra": a.event_extra,
            "events_maxlen": self.settings.events_maxlen,
            "stream_maxlen": self.settings.stream_maxlen,
            "fields": [v for pair in (a.fields or {}).items() for v in pair],
        }
        if a.also_event:
            options["also"] = {
                "event_id": new_event_id(),
                "event": a.also_event,
                "extra": a.also_extra,
            }
        call = ScriptCall(
            Script.ADVANCE,
            [
                self.keys.job(a.job_id),
                self.keys.lease(a.job_id),
                self.keys.stream(partition, a.stream),
                self.keys.events(partition),
                self.keys.stage_stream(partition, a.next_stage, a.stream),
            ],
            [a.token, a.entry_id, self.group, a.request_id, orjson.dumps(options).decode()],
            a.request_id,
        )
        reply = (await self.scripts.run_many([call]))[0]
        if isinstance(reply, Exception):
            return ("transient" if is_transient_reply(reply) else "error", str(reply))
        return str(reply[0]), str(reply[1]) if len(reply) > 1 else ""

    async def announce(
        self,
        job_id: str,
        token: str,
        event: str,
        extra: str,
        fields: Mapping[str, str] | None = None,
    ) -> str:
        """A running job's one-off event (announce.lua): 'ok' | 'already' | 'lease_lost'."""
        partition = partition_of(job_id)
        args: list[Arg] = [token, event, new_event_id(), self.settings.events_maxlen, extra]
        for name, value in (fields or {}).items():
            args.extend((name, value))
        reply = await self.scripts.run(
            ScriptCall(Script.ANNOUNCE, [self.keys.job(job_id), self.keys.events(partition)], args),
            resend_for_s=5.0,
        )
        _raise_on_error(reply)
        return str(reply[0])

    async def meter(self, job_id: str, token: str, unit: str, ms: int) -> str:
        """Record a unit of work the run finished (meter.lua): 'ok' | 'already' |
        'lease_lost'. See shared/engine/metering.py."""
        reply = await self.scripts.run(
            ScriptCall(Script.METER, [self.keys.job(job_id)], [token, unit, max(0, int(ms))]),
            resend_for_s=5.0,
        )
        _raise_on_error(reply)
        return str(reply[0])

    async def note(
        self,
        job_id: str,
        token: str,
        notes: Mapping[str, str],
        event: str = "",
        extra: str = "",
    ) -> str:
        """Write a running job's notes (`note.<name>`, note.lua), fenced by the run's lease,
        optionally with an event: 'ok' | 'cancel_requested' | 'lease_lost'."""
        partition = partition_of(job_id)
        args: list[Arg] = [token, event, new_event_id(), self.settings.events_maxlen, extra]
        for name, value in notes.items():
            args.extend((f"note.{name}", value))
        keys = [self.keys.job(job_id), self.keys.events(partition)]
        reply = await self.scripts.run(ScriptCall(Script.NOTE, keys, args), resend_for_s=5.0)
        _raise_on_error(reply)
        if str(reply[0]) == "ok":
            return "cancel_requested" if str(reply[1]) == "1" else "ok"
        return str(reply[0])

    async def wait_for_new(
        self, partition: int, streams: Sequence[StreamName], consumer: str, block_ms: int
    ) -> list[StreamEntry]:
        """Blocking XREADGROUP `>` for at most one new entry per stream (the idle worker's
        wait; `take` reads the rest). Blocking reads cannot run inside a script."""
        keys: dict[Any, Any] = {self.keys.stream(partition, s): ">" for s in streams}
        reply = await self.redis.xreadgroup(self.group, consumer, keys, count=1, block=block_ms)
        return self._entries(partition, reply)

    def _entries(self, partition: int, reply: Any) -> list[StreamEntry]:
        entries: list[StreamEntry] = []
        if not reply:
            return entries
        items = reply.items() if isinstance(reply, dict) else reply
        for key, messages in items:
            stream = StreamName(str(key).rsplit(":", 1)[1])
            for entry_id, fields in messages:
                entries.append(StreamEntry(partition, stream, entry_id, fields or {}))
        return entries

    async def dead_letter_entry(self, entry: StreamEntry, reason: str, detail: str) -> str:
        args: list[Arg] = [
            entry.entry_id,
            self.group,
            reason,
            detail[:500],
            self.settings.dlq_maxlen,
            entry.stream.value,
        ]
        for name, value in entry.fields.items():
            args.extend((name, value))
        reply = await self.scripts.run(
            ScriptCall(
                Script.DEAD_LETTER_ENTRY,
                [
                    self.keys.stream(entry.partition, entry.stream),
                    self.keys.dead_letters(entry.partition),
                ],
                args,
            )
        )
        _raise_on_error(reply)
        return str(reply)

    async def autoclaim(
        self, partition: int, stream: StreamName, consumer: str, cursor: str, count: int
    ) -> tuple[str, list[StreamEntry], list[str]]:
        """One XAUTOCLAIM page of entries idle longer than the lease TTL.

        Returns (next cursor, claimed entries, ids deleted from the stream while pending).
        """
        reply = await self.redis.xautoclaim(
            self.keys.stream(partition, stream),
            self.group,
            consumer,
            self.settings.lease_ttl_ms,
            start_id=cursor,
            count=count,
        )
        next_cursor = str(reply[0])
        claimed = [
            StreamEntry(partition, stream, entry_id, dict(fields))
            for entry_id, fields in reply[1]
            if fields is not None
        ]
        deleted = [str(i) for i in reply[2]] if len(reply) > 2 else []
        # Entries trimmed while pending come back as nil bodies on some versions too.
        deleted += [entry_id for entry_id, fields in reply[1] if fields is None]
        return next_cursor, claimed, deleted

    async def reclaim_many(self, entries: Sequence[StreamEntry]) -> list[tuple[str, str]]:
        """Decide each autoclaimed entry's fate with its job's lease (see reclaim.lua)."""
        calls = []
        for entry in entries:
            job_id = entry.fields["job"]
            calls.append(
                ScriptCall(
                    Script.RECLAIM,
                    [
                        self.keys.job(job_id),
                        self.keys.lease(job_id),
                        self.keys.stream(entry.partition, entry.stream),
                        self.keys.dead_letters(entry.partition),
                        self.keys.events(entry.partition),
                        *self._entry_claim_keys(entry),
                    ],
                    [
                        entry.entry_id,
                        self.group,
                        self.settings.max_deliveries,
                        new_event_id(),
                        self.settings.events_maxlen,
                        self.settings.dlq_maxlen,
                        EventType.FAILED.value,
                        self.settings.job_retention_ms,
                        self._claim_ttl_ms,
                        entry.stream.value,
                        self.settings.fleet_allowance_ms,
                        self.settings.max_deliveries_hard_cap,
                    ],
                )
            )
        out = []
        for reply in await self.scripts.run_many(calls):
            if isinstance(reply, Exception):  # this entry alone; it stays pending
                out.append(("error", f"{type(reply).__name__}: {reply}"))
            else:
                out.append((str(reply[0]), " ".join(str(part) for part in reply[1:])))
        return out

    async def fleet_tick(self, partitions: Sequence[int], consumer: str = "") -> None:
        """Tell the fleet clock of each partition that this worker (`consumer`) reached Redis
        (one round trip for all). An error reply for one partition leaves its clock for the
        next tick."""
        await self.scripts.run_many(
            [
                ScriptCall(
                    Script.FLEET_TICK,
                    [self.keys.fleet(p)],
                    [self.settings.fleet_allowance_ms, consumer],
                )
                for p in partitions
            ]
        )

    async def fleet_card(self, consumer: str, card: bytes, ttl_ms: int) -> None:
        """Write a worker process's card (shared/engine/fleet.py), expiring after `ttl_ms`."""
        await self.redis.set(self.keys.worker_card(consumer), card, px=ttl_ms)

    async def record_lost_entries(self, partition: int, count: int) -> None:
        await self.redis.incrby(self.keys.alarm_counter(partition), count)

    async def promote_due(self, partition: int, limit: int = 100) -> int:
        """Move due retries back into their streams; returns how many were promoted."""
        delayed_key = self.keys.delayed(partition)
        now_ms = int(time.time() * 1000)
        members = await self.redis.zrangebyscore(delayed_key, "-inf", now_ms, start=0, num=limit)
        if not members:
            return 0
        calls = []
        for member in members:
            stage, stream, job_id = parse_delayed_member(str(member))
            calls.append(
                ScriptCall(
                    Script.PROMOTE,
                    [
                        delayed_key,
                        self.keys.job(job_id),
                        self.keys.stage_stream(partition, stage, stream),
                    ],
                    [member, self.settings.stream_maxlen],
                )
            )
        promoted = 0
        for reply in await self.scripts.run_many(calls):
            # An error reply leaves that member due; the next pass tries it again.
            promoted += not isinstance(reply, Exception) and reply[0] == "promoted"
        return promoted

    async def take_tokens(
        self, tenant: str, rate_per_s: float, burst: int, cost: int = 1, bucket: str = ""
    ) -> tuple[bool, int]:
        """Per-tenant token bucket (one per `bucket` name): (allowed, retry_after_ms)."""
        key = self.keys.rate_limit(tenant, bucket)
        reply = await self.scripts.run(
            ScriptCall(Script.RATE_LIMIT, [key], [rate_per_s, burst, cost])
        )
        _raise_on_error(reply)
        return bool(reply[0]), int(reply[1])

    async def backlog(self, partition: int, stream: StreamName) -> int:
        """Entries in a stream partition (waiting + running: acked entries are deleted)."""
        return int(await self.redis.xlen(self.keys.stream(partition, stream)))

    # -- dead letters (operators) ----------------------------------------------------------

    async def dead_letters(self, partition: int, count: int = 10_000) -> list[DeadLetter]:
        entries = await self.redis.xrange(self.keys.dead_letters(partition), count=count)
        return [DeadLetter(partition, eid, dict(f)) for eid, f in entries]

    async def dead_letter(self, dlq_id: str) -> DeadLetter | None:
        partition, entry_id = parse_dead_letter_id(dlq_id)
        entries = await self.redis.xrange(self.keys.dead_letters(partition), entry_id, entry_id)
        return DeadLetter(partition, entries[0][0], dict(entries[0][1])) if entries else None

    async def redrive(self, letter: DeadLetter) -> tuple[str, str]:
        """Re-enqueue a dead-lettered job: (redriven | gone | not_redrivable, detail)."""
        job_id = letter.fields.get("job", "")
        if not job_id or not is_job_id(job_id) or partition_of(job_id) != letter.partition:
            return "not_redrivable", f"entry has no job of this partition ({letter.reason})"
        job = await self.get(job_id)
        keys = [
            self.keys.dead_letters(letter.partition),
            self.keys.job(job_id),
            self.keys.stream(letter.partition, job.stream if job else StreamName.SYNTHESIS),
            self.keys.events(letter.partition),
        ]
        if job is not None and job.claim_key:
            keys.append(job.claim_key)
        reply = await self.scripts.run(
            ScriptCall(
                Script.REDRIVE,
                keys,
                [
                    letter.entry_id,
                    self.settings.stream_maxlen,
                    new_event_id(),
                    self.settings.events_maxlen,
                    EventType.QUEUED.value,
                    self._claim_ttl_ms,
                    events.queued_fields(job.quality if job else "", keys[2].rsplit(":", 1)[1]),
                    "",
                    0,
                    "",
                    self.redrive_fair_argument(job.quality if job else ""),
                ],
            )
        )
        _raise_on_error(reply)
        return str(reply[0]), str(reply[1]) if len(reply) > 1 else ""

    def redrive_fair_argument(self, quality: str) -> str:
        """redrive.lua's fair-scheduling argument: the job joins its tenant's redrive flow
        (weight 1, no cap), or '' (straight into the stream) when fair scheduling is off."""
        fairness = fairness_of(self.settings)
        if not fairness.enabled:
            return ""
        return fairness.argument(quality, TenantPolicy(), self.group)

    async def purge_dead_letter(self, letter: DeadLetter) -> bool:
        deleted = await self.redis.xdel(self.keys.dead_letters(letter.partition), letter.entry_id)
        return bool(deleted)

    # -- operators and metrics -----------------------------------------------------------

    async def stream_stats(self, partition: int, stream: StreamName) -> StreamStats:
        """Length, pending, lag, consumers and ages of this queue's stream of `stream`; a
        stream or group nobody created yet (a stage no worker runs) reads as one whose
        entries all wait."""
        key = self.keys.stream(partition, stream)
        pipe = self.redis.pipeline(transaction=False)
        pipe.xlen(key)
        pipe.xpending(key, self.group)
        pipe.xinfo_groups(key)
        length, pending, groups = await pipe.execute(raise_on_error=False)
        if isinstance(length, Exception):
            raise length
        if isinstance(pending, Exception):  # NOGROUP: nothing delivered
            pending = None
        if isinstance(groups, Exception):  # no such stream
            groups = []
        lag: int | None = None
        consumers = 0
        last_delivered = "0-0"
        for g in groups:
            if g.get("name") == self.group:
                raw_lag = g.get("lag")
                lag = int(raw_lag) if raw_lag is not None else None
                consumers = int(g.get("consumers", 0))
                last_delivered = str(g.get("last-delivered-id") or "0-0")
        # Waiting = after the group's last-delivered id (delivered entries are the PEL's).
        first_waiting = await self.redis.xrange(key, f"({last_delivered}", "+", count=1)
        oldest = pending.get("min") if pending else None
        now_ms = int(time.time() * 1000)
        return StreamStats(
            partition=partition,
            stream=stream,
            length=int(length),
            pending=int(pending.get("pending", 0)) if pending else 0,
            lag=lag,
            oldest_pending_age_s=_entry_age_s(str(oldest), now_ms) if oldest else 0.0,
            consumers=consumers,
            oldest_waiting_age_s=(
                _entry_age_s(str(first_waiting[0][0]), now_ms) if first_waiting else 0.0
            ),
        )

    async def waiting(self, partition: int, stream: StreamName) -> WaitingStats:
        """How much waits in line (fair queues) and in the stream, and the oldest wait."""
        waiting_key = self.keys.fair_waiting(partition, stream)
        pipe = self.redis.pipeline(transaction=False)
        pipe.zcard(waiting_key)
        pipe.zrange(waiting_key, 0, 0, withscores=True)
        pipe.xlen(self.keys.stream(partition, stream))
        count, oldest, in_stream = await pipe.execute()
        age = 0.0
        if oldest:
            age = max(0.0, time.time() - float(oldest[0][1]) / 1000.0)
        return WaitingStats(int(count), int(in_stream), age)

    async def tenant_backlogs(
        self, partition: int, stream: StreamName
    ) -> dict[str, tuple[int, int]]:
        """Per tenant with work in the fair queues of one stream: (jobs waiting, jobs counted
        against its running cap). Operators' view and per-tenant metrics; O(active tenants).
        A job canceled while it waits leaves its queue at once (cancel.lua)."""
        state = await self.redis.hgetall(f"{self.keys.fair_base(partition, stream)}:state")  # type: ignore[misc]
        tenants = sorted(
            {k[2:] for k in state if k.startswith(("a:", "r:"))}  # in line, or running capped
        )
        if not tenants:
            return {}
        pipe = self.redis.pipeline(transaction=False)
        for tenant in tenants:
            pipe.llen(self.keys.fair_queue(partition, stream, tenant))
        lengths = await pipe.execute()
        return {
            t: (int(n), int(state.get(f"r:{t}", 0))) for t, n in zip(tenants, lengths, strict=True)
        }

    async def partition_counts(self, partition: int) -> dict[str, int]:
        pipe = self.redis.pipeline(transaction=False)
        pipe.zcard(self.keys.delayed(partition))
        pipe.xlen(self.keys.dead_letters(partition))
        pipe.xlen(self.keys.events(partition))
        pipe.get(self.keys.alarm_counter(partition))
        delayed, dlq, evts, lost = await pipe.execute()
        return {
            "delayed": int(delayed),
            "dead_letters": int(dlq),
            "events": int(evts),
            "lost_entries": int(lost or 0),
        }

    async def prune_consumers(self, partition: int, stream: StreamName, idle_ms: int) -> int:
        """Delete consumers of dead workers (no pending entries, idle for `idle_ms`)."""
        reply = await self.scripts.run(
            ScriptCall(
                Script.PRUNE_CONSUMERS,
                [self.keys.stream(partition, stream)],
                [self.group, idle_ms, PARKING_CONSUMER],
            )
        )
        _raise_on_error(reply)
        return int(reply)


def parse_dead_letter_id(dlq_id: str) -> tuple[int, str]:
    """`<partition>/<entry id>` -> (partition, entry id); ValueError otherwise."""
    partition, sep, entry_id = dlq_id.partition("/")
    ms, dash, seq = entry_id.partition("-")
    if not (sep and dash and partition.isdigit() and ms.isdigit() and seq.isdigit()):
        raise ValueError(f"not a dead-letter id (expected <partition>/<entry id>): {dlq_id!r}")
    return int(partition), entry_id


def _parse_job(flat: list[str]) -> tuple[JobRecord | None, str]:
    """A started job's hash, or why it cannot be read (the worker then fails that job alone)."""
    try:
        return JobRecord.from_hash(pairs_to_dict(flat)), ""
    except (KeyError, ValueError, TypeError) as exc:
        return None, f"unreadable job record: {type(exc).__name__}: {exc}"[:500]


def _raise_on_error(reply: Any) -> None:
    if isinstance(reply, Exception):
        raise reply
