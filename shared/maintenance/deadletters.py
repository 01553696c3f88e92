"""The redriver's Redis I/O on dead letters of both kinds: pages of entries, what a policy
needs to know of each (its subject's redrive count and error, an endpoint's or a hosted
model vendor's circuit), redrives
and notes that write their audit record in the same script, and audit trails.

Calls the engine's scripts directly (redrive.lua, wh_redrive.lua with their optional audit
arguments; dlq_note.lua); every call stays in the entry's `{pN}` slot.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from redis.exceptions import ResponseError

from splatq.shared.engine import events
from splatq.shared.engine.events import EventType
from splatq.shared.engine.ids import is_job_id, new_event_id, partition_of
from splatq.shared.engine.keys import StreamName
from splatq.shared.engine.metering import discarded_unit_fields, metered_units
from splatq.shared.engine.queue import DeadLetter, JobQueue
from splatq.shared.engine.scripts import Arg, Script, ScriptCall
from splatq.shared.engine.stages import PipelineStage, cleared_ledger_fields, stages_from
from splatq.shared.maintenance.audit import AUDIT_TTL_MS, AuditRecord
from splatq.shared.maintenance.keys import DeadLetterKind, MaintenanceKeys
from splatq.shared.maintenance.policy import LetterView
from splatq.shared.maintenance.scripts import MaintenanceScript
from splatq.shared.vendor.circuits import vendor_circuits_closed
from splatq.shared.webhooks.scripts import WebhookScript


@dataclass(frozen=True, slots=True)
class Subject:
    """A dead letter with what its subject (job or message) says about itself."""

    kind: DeadLetterKind
    letter: DeadLetter
    subject: str  # job id / message id ('' for a malformed entry)
    fields: Mapping[str, str]  # of the job or message hash ({} when gone)
    circuit_closed: bool = True

    def view(self) -> LetterView:
        codes = {self.letter.reason}
        if self.fields.get("error_code"):
            codes.add(self.fields["error_code"])
        codes.discard("")
        raw = self.fields.get("redrives", "0")
        return LetterView(
            kind=self.kind,
            codes=frozenset(codes),
            at_ms=self.letter.at_ms,
            redrives=int(raw) if raw.isdigit() else 0,
            redrivable=bool(self.subject and self.fields),
            circuit_closed=self.circuit_closed,
        )


def subject_of(kind: DeadLetterKind, letter: DeadLetter) -> str:
    if kind is DeadLetterKind.WEBHOOKS:
        return letter.fields.get("message", "")
    job_id = letter.fields.get("job", "")
    ok = job_id and is_job_id(job_id) and partition_of(job_id) == letter.partition
    return job_id if ok else ""


def _target(fields: Mapping[str, str]) -> str:
    return fields.get("target") or "job"


class DeadLetterBook:
    def __init__(self, queue: JobQueue) -> None:
        self.queue = queue
        self.redis = queue.redis
        self.schema = queue.keys
        self.keys = MaintenanceKeys(queue.keys)
        queue.scripts.register(WebhookScript)
        queue.scripts.register(MaintenanceScript)

    async def page(
        self, kind: DeadLetterKind, partition: int, after: str, count: int
    ) -> list[DeadLetter]:
        """Up to `count` entries after entry id `after` ('' = from the start)."""
        start = f"({after}" if after else "-"
        entries = await self.redis.xrange(
            self.keys.dead_letters(kind, partition), start, "+", count=count
        )
        return [DeadLetter(partition, str(eid), dict(f)) for eid, f in entries]

    async def subjects(self, kind: DeadLetterKind, letters: Sequence[DeadLetter]) -> list[Subject]:
        """Each entry's subject, read in one round trip (and one more for circuits)."""
        ids = [subject_of(kind, x) for x in letters]
        pipe = self.redis.pipeline(transaction=False)
        for letter, subject in zip(letters, ids, strict=True):
            if not subject:
                pipe.exists("")  # placeholder: keeps replies aligned
            elif kind is DeadLetterKind.JOBS:
                pipe.hgetall(self.schema.job(subject))
            else:
                pipe.hgetall(self.schema.webhook_message(letter.partition, subject))
        # One unreadable record (a Lua error's cause: a wrong type) must not stop the sweep
        # at this batch for good: it reads as empty, its redrive answers the error alone.
        replies = await pipe.execute(raise_on_error=False)
        for reply in replies:
            if isinstance(reply, Exception) and not isinstance(reply, ResponseError):
                raise reply  # a connection error: the batch is retried from its checkpoint
        hashes = [dict(r) if isinstance(r, dict) else {} for r in replies]
        if kind is DeadLetterKind.WEBHOOKS:
            circuits = await self._circuits_closed(letters)
        else:  # a hosted model's job: its vendor's circuit (shared/vendor/circuits.py)
            circuits = await vendor_circuits_closed(self.redis, hashes, self.schema.prefix)
        return [
            Subject(kind, letter, subject, fields, closed)
            for letter, subject, fields, closed in zip(letters, ids, hashes, circuits, strict=True)
        ]

    async def _circuits_closed(self, letters: Sequence[DeadLetter]) -> list[bool]:
        """Whether each message's endpoint is enabled with a closed circuit (job webhook_url
        targets have no circuit: always True)."""
        endpoints = [(x.fields.get("tenant", ""), _target(x.fields)) for x in letters]
        pipe = self.redis.pipeline(transaction=False)
        for tenant, target in endpoints:
            if target != "job":
                key = self.schema.webhook_endpoint(tenant, target)
                pipe.hmget(key, ["circuit", "disabled_at_ms", "url"])
        replies = iter(await pipe.execute())
        out = []
        for _, target in endpoints:
            if target == "job":
                out.append(True)
                continue
            circuit, disabled, url = next(replies)
            out.append(bool(url) and not disabled and (circuit or "closed") == "closed")
        return out

    async def last_actions(self, subjects: Sequence[Subject]) -> list[tuple[str, str]]:
        """(entry id, action) of each subject's latest audit record, ('', '') when none."""
        pipe = self.redis.pipeline(transaction=False)
        for s in subjects:
            pipe.xrevrange(self._audit_key(s), count=1)
        out = []
        for reply in await pipe.execute():
            fields = dict(reply[0][1]) if reply else {}
            out.append((fields.get("entry", ""), fields.get("action", "")))
        return out

    def _audit_key(self, s: Subject) -> str:
        return self.keys.audit(s.kind, s.letter.partition, s.subject, s.letter.entry_id)

    async def audit_trail(self, kind: DeadLetterKind, letter: DeadLetter) -> list[dict[str, str]]:
        """Every recorded action on the entry's subject, oldest first."""
        key = self.keys.audit(kind, letter.partition, subject_of(kind, letter), letter.entry_id)
        return [{"id": str(eid), **dict(f)} for eid, f in await self.redis.xrange(key)]

    # -- actions ---------------------------------------------------------------------------

    def redrive_call(
        self,
        s: Subject,
        record: AuditRecord,
        hint: Mapping[str, str] | None = None,
        from_stage: PipelineStage | None = None,
    ) -> ScriptCall:
        """The script call that redrives one entry and records it (see redrive_many). A job
        goes back to the entry streams: in the staged pipeline each stage whose ledger holds
        a success for the same inputs skips its work, so the job resumes where it failed;
        `from_stage` clears the records of that stage and every later one, so they run
        again."""
        p = s.letter.partition
        if s.kind is DeadLetterKind.WEBHOOKS:
            f = s.letter.fields
            index = self.schema.webhook_dead_letter_index(p, f.get("tenant", ""), _target(f))
            return ScriptCall(
                WebhookScript.WH_REDRIVE,
                [
                    self.schema.webhook_due(p),
                    self.schema.webhook_dead_letters(p),
                    self.schema.webhook_message(p, s.subject),
                    index,
                ],
                [s.letter.entry_id, s.subject, record.encoded()],
            )
        stream = s.fields.get("stream", StreamName.SYNTHESIS.value)
        keys = [
            self.schema.dead_letters(p),
            self.schema.job(s.subject),
            self.schema.stream(p, StreamName(stream)),
            self.schema.events(p),
        ]
        if s.fields.get("claim_key"):
            keys.append(s.fields["claim_key"])
        hint_pairs: list[str] = []
        for name, value in (hint or {}).items():
            hint_pairs += [f"hint_{name}", value]
        if from_stage is not None:
            # The records of that stage and later ones go, and the stage's input digest gets
            # a fresh nonce: it runs again even where its outputs are stored (a bad output,
            # say), and so does every later stage (their inputs' digests change with it).
            hint_pairs += cleared_ledger_fields(stages_from(from_stage))
            hint_pairs += [f"rerun.{from_stage.value}", new_event_id()]
            # Their earlier work is no longer the job's: its metered units go (the rerun
            # meters its own), so the quota never charges both.
            rerun = [stage.value for stage in stages_from(from_stage)]
            hint_pairs += discarded_unit_fields(metered_units(s.fields), rerun)
            if PipelineStage.RECONSTRUCT in stages_from(from_stage):
                # a new quick result (progressive jobs) is announced again
                hint_pairs += [f"announced.{EventType.PREVIEW_READY.value}", "", "quick_run", ""]
        args: list[Arg] = [
            s.letter.entry_id,
            self.queue.settings.stream_maxlen,
            new_event_id(),
            self.queue.settings.events_maxlen,
            EventType.QUEUED.value,
            self.queue.settings.idempotency_ttl_s * 1000,
            events.queued_fields(s.fields.get("quality", ""), stream),
            record.encoded(),
            max(self.queue.settings.job_retention_ms, AUDIT_TTL_MS),
            orjson.dumps(hint_pairs).decode() if hint_pairs else "",
            self.queue.redrive_fair_argument(s.fields.get("quality", "")),
        ]
        return ScriptCall(Script.REDRIVE, keys, args)

    async def redrive_many(
        self, calls: Sequence[tuple[Subject, ScriptCall]]
    ) -> list[tuple[str, str]]:
        """Redrive many entries in one round trip: (redriven | gone | not_redrivable | error,
        detail) each."""
        replies = await self.queue.scripts.run_many([c for _, c in calls], resend_for_s=5.0)
        return [_redrive_outcome(s.kind, r) for (s, _), r in zip(calls, replies, strict=True)]

    async def note(self, s: Subject, record: AuditRecord, purge: bool = False) -> str:
        """Record a decision (held, exhausted) or a purge: 'noted' | 'purged' | 'gone'."""
        keys = [self.keys.dead_letters(s.kind, s.letter.partition), self._audit_key(s)]
        args: list[Arg] = [s.letter.entry_id, "1" if purge else "0", record.encoded(),
                           AUDIT_TTL_MS]  # fmt: skip
        if s.kind is DeadLetterKind.WEBHOOKS:
            f = s.letter.fields
            keys.append(
                self.schema.webhook_dead_letter_index(
                    s.letter.partition, f.get("tenant", ""), _target(f)
                )
            )
            args.append(f"{s.letter.entry_id} {f.get('message', '')}")
        reply = await self.queue.scripts.run(
            ScriptCall(MaintenanceScript.DLQ_NOTE, keys, args), resend_for_s=5.0
        )
        if isinstance(reply, Exception):
            raise reply
        return str(reply)


def _redrive_outcome(kind: DeadLetterKind, reply: Any) -> tuple[str, str]:
    if isinstance(reply, Exception):
        return "error", f"{type(reply).__name__}: {reply}"
    if kind is DeadLetterKind.WEBHOOKS:
        redriven, expired, _ = (int(x) for x in reply)
        if redriven:
            return "redriven", ""
        if expired:
            return "not_redrivable", "the message has expired (its payload is gone); purge it"
        return "gone", "already pending or delivered"
    return str(reply[0]), str(reply[1]) if len(reply) > 1 else ""
