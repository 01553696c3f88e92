"""The policy sweep (task `redrive_sweep`): every dead letter of both kinds, partition by
partition in entry order, in checkpointed batches. Each batch's decisions are pure
(policy.decide); redrives wait for the global bucket and go out in one round trip; a hold is
recorded once per entry (not at every sweep)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import structlog

from splatq.shared.maintenance.audit import AuditAction, AuditRecord, policy_actor
from splatq.shared.maintenance.bucket import RedriveBucket
from splatq.shared.maintenance.config import RedriverConfig
from splatq.shared.maintenance.deadletters import DeadLetterBook, Subject
from splatq.shared.maintenance.keys import DeadLetterKind
from splatq.shared.maintenance.policy import Decision, Verdict, decide
from splatq.shared.maintenance.schedule import Schedule
from splatq.shared.maintenance.scheduler import TaskRun
from splatq.shared.maintenance.summary import DeadLetterSummary

log = structlog.get_logger("splatq.redriver")
KINDS = (DeadLetterKind.JOBS, DeadLetterKind.WEBHOOKS)

# (kind, policy, outcome) -> count: the redriver's counter of redrives.
OnRedrive = Callable[[DeadLetterKind, str, str], None]


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where a sweep stands: kind index, partition, last entry id handled ('' = start)."""

    kind: int = 0
    partition: int = 0
    after: str = ""

    def encoded(self) -> str:
        return f"{self.kind}|{self.partition}|{self.after}"

    @classmethod
    def parse(cls, raw: str) -> Cursor:
        parts = raw.split("|")
        if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit():
            return cls()
        return cls(int(parts[0]), int(parts[1]), parts[2])


@dataclass(slots=True)
class SweepTally:
    verdicts: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)

    def line(self) -> str:
        seen = ", ".join(f"{k} {v}" for k, v in sorted(self.verdicts.items())) or "nothing"
        done = ", ".join(f"{k} {v}" for k, v in sorted(self.outcomes.items())) or "none"
        return f"decisions: {seen}; redrives: {done}"


class RedriveSweep:
    name = "redrive_sweep"

    def __init__(
        self,
        book: DeadLetterBook,
        config: RedriverConfig,
        bucket: RedriveBucket,
        schedule: Schedule,
        holder: str,
        on_redrive: OnRedrive | None = None,
    ) -> None:
        self.book = book
        self.config = config
        self.bucket = bucket
        self.schedule = schedule
        self.holder = holder
        self._on_redrive = on_redrive
        self._partitions = book.queue.settings.partitions

    async def run(self, run: TaskRun) -> str:
        cursor = Cursor.parse(run.checkpoint)
        tally = SweepTally()
        summary = DeadLetterSummary()
        for k in range(cursor.kind, len(KINDS)):
            first_p = cursor.partition if k == cursor.kind else 0
            for p in range(first_p, self._partitions):
                after = cursor.after if (k, p) == (cursor.kind, cursor.partition) else ""
                while True:
                    letters = await self.book.page(KINDS[k], p, after, self.config.batch)
                    if not letters:
                        break
                    subjects = await self.book.subjects(KINDS[k], letters)
                    kept = await self.act(subjects, tally)
                    summary.add_all(KINDS[k], kept)
                    after = letters[-1].entry_id
                    await run.save(Cursor(k, p, after).encoded())
        if not run.resumed:  # a whole pass: its depth and ages stand for the whole queue
            await summary.store(self.book)
        return tally.line()

    def decisions(self, subjects: Sequence[Subject]) -> list[Decision]:
        now_ms = int(time.time() * 1000)
        return [decide(self.config.policies, s.view(), now_ms) for s in subjects]

    async def act(self, subjects: Sequence[Subject], tally: SweepTally) -> list[Subject]:
        """Apply the policies to one batch; returns the entries that stay dead letters."""
        decisions = self.decisions(subjects)
        for d in decisions:
            tally.verdicts[d.verdict.value] += 1
        await self._note_holds(subjects, decisions)
        redrives = [(s, d) for s, d in zip(subjects, decisions, strict=True)
                    if d.verdict is Verdict.REDRIVE]  # fmt: skip
        gone: set[str] = set()
        done = 0
        while done < len(redrives):
            taken = await self.bucket.take(len(redrives) - done)
            chunk = redrives[done : done + taken]
            done += taken
            calls = [(s, self.book.redrive_call(s, self._record(s, d), d.hint)) for s, d in chunk]
            for (s, d), (outcome, detail) in zip(
                chunk, await self.book.redrive_many(calls), strict=True
            ):
                tally.outcomes[outcome] += 1
                if outcome in {"redriven", "gone"}:
                    gone.add(s.letter.entry_id)
                if self._on_redrive is not None:
                    self._on_redrive(s.kind, d.policy, outcome)
                log.info("redrive", kind=s.kind.value, entry=s.letter.id, subject=s.subject,
                         policy=d.policy, outcome=outcome, detail=detail or None)  # fmt: skip
        return [s for s in subjects if s.letter.entry_id not in gone]

    def _record(self, s: Subject, d: Decision) -> AuditRecord:
        action = {
            Verdict.REDRIVE: AuditAction.REDRIVEN,
            Verdict.EXHAUSTED: AuditAction.EXHAUSTED,
        }.get(d.verdict, AuditAction.HELD)
        codes = ",".join(sorted(s.view().codes))
        return AuditRecord(action, d.why, s.kind.value, policy_actor(d.policy, self.holder), codes)

    async def _note_holds(self, subjects: Sequence[Subject], decisions: Sequence[Decision]) -> None:
        """Record each hold once: skipped when the subject's latest record already says so
        for this entry."""
        held = [(s, d) for s, d in zip(subjects, decisions, strict=True)
                if d.verdict in {Verdict.HOLD, Verdict.EXHAUSTED}]  # fmt: skip
        if not held:
            return
        last = await self.book.last_actions([s for s, _ in held])
        for (s, d), (entry, action) in zip(held, last, strict=True):
            record = self._record(s, d)
            if (entry, action) != (s.letter.entry_id, record.action.value):
                await self.book.note(s, record)
