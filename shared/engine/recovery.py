"""The recovery role (the reaper, the redriver, operators): dead-letter an entry, reclaim
abandoned ones, the fleet's liveness, delayed retries coming due, and the dead-letter
queue (list, read, redrive, purge); pruning idle consumers."""

from __future__ import annotations

import time
from collections.abc import Sequence

from splatq.shared.engine import events
from splatq.shared.engine.backend import Role
from splatq.shared.engine.events import EventType
from splatq.shared.engine.fairness import TenantPolicy, fairness_of
from splatq.shared.engine.ids import is_job_id, new_event_id, partition_of
from splatq.shared.engine.keys import StreamName
from splatq.shared.engine.queue_types import (
    PARKING_CONSUMER,
    DeadLetter,
    StreamEntry,
    parse_dead_letter_id,
    parse_delayed_member,
    raise_on_error,
)
from splatq.shared.engine.replies import Reply
from splatq.shared.engine.scripts import Arg, Script, ScriptCall


class Recovery(Role):
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
        raise_on_error(reply)
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
            promoted += not isinstance(reply, Exception) and reply[0] == Reply.PROMOTED
        return promoted

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
        raise_on_error(reply)
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

    async def prune_consumers(self, partition: int, stream: StreamName, idle_ms: int) -> int:
        """Delete consumers of dead workers (no pending entries, idle for `idle_ms`)."""
        reply = await self.scripts.run(
            ScriptCall(
                Script.PRUNE_CONSUMERS,
                [self.keys.stream(partition, stream)],
                [self.group, idle_ms, PARKING_CONSUMER],
            )
        )
        raise_on_error(reply)
        return int(reply)
