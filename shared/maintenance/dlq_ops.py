"""A person's actions on dead letters, shared by `splatq dlq` and the admin API (the console):
read an entry as it is shown, list the newest entries, and redrive or purge one through the
scripts that write its audit record in the same step (shared/maintenance/deadletters.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson

from splatq.shared.engine.queue import DeadLetter
from splatq.shared.engine.stages import PipelineStage
from splatq.shared.maintenance.audit import AuditAction, AuditRecord
from splatq.shared.maintenance.deadletters import DeadLetterBook
from splatq.shared.maintenance.keys import DeadLetterKind


def describe(letter: DeadLetter) -> dict[str, Any]:
    """The entry as `splatq dlq list/show --json` and the admin API show it."""
    fields = dict(letter.fields)
    described: dict[str, Any] = {
        "id": letter.id,
        "reason": letter.reason,
        "job_id": letter.job_id or None,
        "at": datetime.fromtimestamp(letter.at_ms / 1000, UTC).isoformat(),
        "fields": fields,
    }
    if "attempt_log" in fields:  # a webhook message's attempts, one JSON object per line
        lines = fields.pop("attempt_log").splitlines()
        described["attempts"] = [orjson.loads(line) for line in lines if line]
    return described


async def newest(
    book: DeadLetterBook, kind: DeadLetterKind, partitions: int, limit: int
) -> tuple[list[DeadLetter], int]:
    """The `limit` newest entries of a kind over every partition, newest first, and how many
    entries there are in all."""
    pipe = book.redis.pipeline(transaction=False)
    for p in range(partitions):
        pipe.xrevrange(book.keys.dead_letters(kind, p), "+", "-", count=limit)
        pipe.xlen(book.keys.dead_letters(kind, p))
    replies = await pipe.execute()
    letters = [DeadLetter(p, eid, dict(f)) for p in range(partitions) for eid, f in replies[2 * p]]
    letters.sort(key=lambda x: (x.at_ms, x.entry_id), reverse=True)
    return letters[:limit], sum(int(n) for n in replies[1::2])


class AuditedDeadLetters:
    """Redrive and purge one kind's entries as `actor` (`person:<name>`), each through the
    script that also writes the audit record."""

    def __init__(
        self,
        book: DeadLetterBook,
        kind: DeadLetterKind,
        actor: str,
        from_stage: PipelineStage | None = None,
        via: str = "splatq dlq",
    ) -> None:
        self.book = book
        self.kind = kind
        self.actor = actor
        self.from_stage = from_stage
        self.via = via

    def _record(self, action: AuditAction, letter: DeadLetter) -> AuditRecord:
        why = f"{self.via} {'redrive' if action is AuditAction.REDRIVEN else 'purge'}"
        return AuditRecord(action, why, self.kind.value, self.actor, letter.reason)

    async def redrive(self, letter: DeadLetter) -> tuple[str, str]:
        """(redriven | gone | not_redrivable | error, detail)."""
        [subject] = await self.book.subjects(self.kind, [letter])
        if not subject.subject:
            return "not_redrivable", f"entry has no job of this partition ({letter.reason})"
        if not subject.fields and self.kind is DeadLetterKind.JOBS:
            return "not_redrivable", "no job record"
        call = self.book.redrive_call(
            subject, self._record(AuditAction.REDRIVEN, letter), from_stage=self.from_stage
        )
        [outcome] = await self.book.redrive_many([(subject, call)])
        return outcome

    async def purge_dead_letter(self, letter: DeadLetter) -> bool:
        [subject] = await self.book.subjects(self.kind, [letter])
        record = self._record(AuditAction.PURGED, letter)
        return await self.book.note(subject, record, purge=True) == "purged"

    async def audit_trail(self, letter: DeadLetter) -> list[dict[str, str]]:
        return await self.book.audit_trail(self.kind, letter)
