"""The runs' role (workers): take and start jobs, renew their leases, report progress,
finish them, advance a staged job to its next stage, announce, meter and note."""

from __future__ import annotations

import random
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from redis.exceptions import ResponseError

from splatq.shared.engine import events
from splatq.shared.engine.backend import Role
from splatq.shared.engine.events import EventType
from splatq.shared.engine.fairness import fairness_of
from splatq.shared.engine.ids import new_event_id, partition_of
from splatq.shared.engine.jobs import JOB_FORMAT_VERSION, pairs_to_dict
from splatq.shared.engine.keys import StreamName
from splatq.shared.engine.queue_types import (
    PARKING_CONSUMER,
    RENEW_UNKNOWN,
    Advance,
    Finish,
    StartedRecord,
    StartResult,
    StreamEntry,
    Taken,
    delayed_member,
    raise_on_error,
    started_record,
)
from splatq.shared.engine.replies import Reply
from splatq.shared.engine.scripts import Arg, Script, ScriptCall, new_request_id
from splatq.shared.engine.stages import next_stage
from splatq.shared.redis.client import is_transient_reply
from splatq.shared.redis.replay import replay_key
from splatq.shared.redis.retry import read_while_unavailable


class Runs(Role):
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
        replies = await self.scripts.run_many(calls, resend_for_s)
        started = [
            (entry.fields["job"], token)
            for entry, token, reply in zip(entries, tokens, replies, strict=True)
            if not isinstance(reply, Exception) and str(reply[0]) == Reply.STARTED
        ]
        records = iter(await self.read_started(started, resend_for_s))
        results: list[StartResult] = []
        for reply in replies:
            if isinstance(reply, Exception):
                # An error reply (OOM, READONLY, a script error) concerns this entry alone:
                # it stays pending and the reaper offers it again later.
                results.append(StartResult("error", detail=f"{type(reply).__name__}: {reply}"))
                continue
            outcome = str(reply[0])
            if outcome == Reply.STARTED:
                read = next(records)
                results.append(StartResult(read.outcome, read.job, read.detail))
            else:
                results.append(StartResult(outcome, detail=str(reply[1]) if len(reply) > 1 else ""))
        return results

    async def read_started(
        self, started: Sequence[tuple[str, str]], resend_for_s: float = 0.0
    ) -> list[StartedRecord]:
        """The records of jobs this worker has just started ((job id, lease token) each), in
        one round trip: the start scripts answer no record (shipping it through Lua cost Redis
        several times a plain HGETALL). A read, so read again as it is after a lost
        connection or a 'not now' error reply (a slot in migration, LOADING) for
        `resend_for_s`. A record whose `lease_token` is no longer the run's (another worker
        took the job over in between: a stall past the lease) reads as `busy`, one that
        cannot be parsed as `corrupt`, another error reply for one read as `error`."""
        if not started:
            return []

        async def read() -> list[Any]:
            pipe = self.redis.pipeline(transaction=False)
            for job_id, _ in started:
                pipe.hgetall(self.keys.job(job_id))
            replies = list(await pipe.execute(raise_on_error=False))
            for reply in replies:
                if isinstance(reply, Exception) and is_transient_reply(reply):
                    raise reply  # the whole read again (a read: nothing happens twice)
            return replies

        replies = await read_while_unavailable(read, resend_for_s, "read_started")
        return [
            started_record(job_id, token, reply)
            for (job_id, token), reply in zip(started, replies, strict=True)
        ]

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
        downstream, bound = self._downstream(partition)
        options: dict[str, Any] = {
            "group": self.group,
            "consumer": consumer,
            "own_interactive": own.get(StreamName.INTERACTIVE, 0),
            "own_synthesis": own.get(StreamName.SYNTHESIS, 0),
            "idle": idle,
            "ttl_ms": self.settings.lease_ttl_ms,
            "nonce": nonce,
            "events_maxlen": self.settings.events_maxlen,
            "started": EventType.STARTED.value,
            "failed": EventType.FAILED.value,
            "claim_ttl_ms": self._claim_ttl_ms,
            "tag": self.keys.tag(partition),
            "event_id_base": new_event_id(),
            "format": JOB_FORMAT_VERSION,
            "memo_ttl_ms": self.settings.script_replay_ttl_ms,
            "running": running,
            "dlq_maxlen": self.settings.dlq_maxlen,
            "quantum": fairness_of(self.settings).quantum,
            "stream_maxlen": self.settings.stream_maxlen,
            "fair": not self.keys.stage,  # only the entry streams are fed fairly
            "downstream": downstream,
            "bound": bound,
            "stage": self.stage.value if self.stage is not None else "",
        }
        reply = await self.scripts.run(
            ScriptCall(
                Script.TAKE,
                [
                    first_key,
                    self.keys.stream(partition, StreamName.SYNTHESIS),
                    self.keys.events(partition),
                    replay_key(first_key, request_id),
                ],
                [orjson.dumps(options).decode()],
                request_id,
            ),
            resend_for_s,
        )
        raise_on_error(reply)
        records = iter(
            await self.read_started(
                [
                    (str(payload[0]), nonce + entry_id)
                    for _, entry_id, outcome, payload in reply
                    if outcome == Reply.STARTED
                ],
                resend_for_s,
            )
        )
        taken: list[Taken] = []
        for stream_name, entry_id, outcome, payload in reply:
            stream = StreamName(stream_name)
            if outcome in (Reply.HELD, Reply.DRAINED):
                taken.append(Taken(StreamEntry(partition, stream, "", {}), outcome))
            elif outcome == Reply.STARTED:
                read = next(records)
                entry = StreamEntry(
                    partition,
                    stream,
                    entry_id,
                    {"job": str(payload[0]), "claim": read.raw.get("claim_key", "")},
                )
                taken.append(Taken(entry, read.outcome, read.job, nonce + entry_id, read.detail))
            elif outcome == Reply.RAW:
                taken.append(
                    Taken(StreamEntry(partition, stream, entry_id, pairs_to_dict(payload)), outcome)
                )
            elif outcome == Reply.DEAD_LETTERED:
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
        raise_on_error(reply)
        return int(reply)

    async def finish_many(self, requests: Sequence[Finish]) -> list[tuple[str, str]]:
        """Commit many exits from processing in one round trip -- one script call per
        partition (finish_batch.lua) -- and answer (outcome, status) each, or ('transient',
        why) for an error reply worth resending (OOM, READONLY) and ('error', why) for one
        that is not. One job's error does not fail its batch-mates."""
        by_partition: dict[int, list[int]] = {}
        for i, f in enumerate(requests):
            by_partition.setdefault(partition_of(f.job_id), []).append(i)
        calls: list[ScriptCall] = []
        members: list[list[int]] = []
        fair_feed = f"{fairness_of(self.settings).quantum} {self.settings.stream_maxlen}"
        for indices in by_partition.values():
            parts = [self._finish_parts(requests[i], fair_feed) for i in indices]
            if len(parts) == 1:
                keys, args = parts[0]
                calls.append(ScriptCall(Script.FINISH, keys, args))
            else:
                counts = ";".join(f"{len(k)},{len(a)}" for k, a in parts)
                calls.append(
                    ScriptCall(
                        Script.FINISH_BATCH,
                        [key for k, _ in parts for key in k],
                        [counts, *(arg for _, a in parts for arg in a)],
                    )
                )
            members.append(indices)
        out: list[tuple[str, str]] = [("error", "not sent")] * len(requests)
        for indices, reply in zip(members, await self.scripts.run_many(calls), strict=True):
            if isinstance(reply, Exception):  # the whole call: each of its jobs alike
                outcome = ("transient" if is_transient_reply(reply) else "error", str(reply))
                for i in indices:
                    out[i] = outcome
                continue
            replies = [reply] if len(indices) == 1 else reply
            for i, r in zip(indices, replies, strict=True):
                out[i] = _finish_outcome(r)
        return out

    def _finish_parts(self, f: Finish, fair_feed: str) -> tuple[list[str], list[Arg]]:
        """finish.lua's KEYS and ARGV for one exit; `fair_feed`: 'quantum stream_maxlen'."""
        partition = partition_of(f.job_id)
        keys = [
            self.keys.job(f.job_id),
            self.keys.lease(f.job_id),
            self.keys.stream(partition, f.stream),
            self.keys.events(partition),
            self.keys.delayed(partition),
            self.keys.for_stage("").stream(partition, f.stream),  # its fair queue's feed
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
            fair_feed,
        ]
        for name, value in (f.fields or {}).items():
            args.extend((name, value))
        return keys, args

    def _downstream(self, partition: int) -> tuple[str, int]:
        """take.lua's backpressure arguments: the next stage's stream key without its class,
        and how many entries it may hold per class (a monolithic or last stage: none)."""
        bound = self.settings.stage_buffer
        after = next_stage(self.stage) if self.stage is not None else None
        if not bound or after is None:
            return "", 0
        key = self.keys.stage_stream(partition, after.value, StreamName.INTERACTIVE)
        return key[: -len(StreamName.INTERACTIVE.value)], bound

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
        raise_on_error(reply)
        return str(reply[0])

    async def meter(self, job_id: str, token: str, unit: str, ms: int) -> str:
        """Record a unit of work the run finished (meter.lua): 'ok' | 'already' |
        'lease_lost'. See shared/engine/metering.py."""
        reply = await self.scripts.run(
            ScriptCall(Script.METER, [self.keys.job(job_id)], [token, unit, max(0, int(ms))]),
            resend_for_s=5.0,
        )
        raise_on_error(reply)
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
        raise_on_error(reply)
        if str(reply[0]) == Reply.OK:
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


def _finish_outcome(reply: Any) -> tuple[str, str]:
    """One job's finish.lua reply (or finish_batch.lua's {'error', why} for a job whose
    finish raised) as (outcome, status)."""
    if reply[0] == Reply.ERROR:
        why = str(reply[1])
        return ("transient" if is_transient_reply(ResponseError(why)) else "error", why)
    return (str(reply[0]), str(reply[1]) if len(reply) > 1 else "")
