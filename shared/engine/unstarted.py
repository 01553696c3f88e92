"""What a worker does with a delivered entry whose job did not start: a job record it cannot
read fails alone (permanent, `CORRUPT_JOB_RECORD`) instead of crashing the worker on every
delivery; an entry without a job record is dead-lettered (`UNKNOWN_JOB`); one the start
script dead-lettered itself (a corrupt record) is counted; anything else (canceled meanwhile,
another worker's) is logged."""

from __future__ import annotations

from typing import Any

from splatq.shared.engine import events
from splatq.shared.engine.entries import UNKNOWN_JOB
from splatq.shared.engine.events import EventType
from splatq.shared.engine.metrics import EngineMetrics
from splatq.shared.engine.queue_types import Finish, StreamEntry
from splatq.shared.engine.reaper import Reaper
from splatq.shared.engine.replies import Reply
from splatq.shared.engine.runs import Runs
from splatq.shared.errors import CORRUPT_JOB_RECORD


class Unstarted:
    def __init__(self, runs: Runs, reaper: Reaper, metrics: EngineMetrics | None, log: Any) -> None:
        self.queue = runs
        self.reaper = reaper
        self.metrics = metrics
        self.log = log

    async def handle(self, entry: StreamEntry, token: str, outcome: str, detail: str) -> None:
        if outcome == "corrupt":
            only = {"job": entry.fields["job"], "claim": entry.fields.get("claim", "")}
            await self._fail_unreadable(
                StreamEntry(entry.partition, entry.stream, entry.entry_id, only), token, detail
            )
        elif outcome == Reply.UNKNOWN:
            await self.reaper.dead_letter_entry(entry, UNKNOWN_JOB, "no job record for this entry")
        elif outcome == Reply.DEAD_LETTERED:
            self._count_corrupt(entry, detail)
        elif outcome == Reply.ERROR:
            # Started, but its record could not be read back (an error reply that waiting
            # does not cure, e.g. NOPERM). Not run here; its lease lapses and the reaper
            # delivers it again, up to the delivery limit, then dead-letters it.
            self.log.error(
                "job.started_record_unreadable",
                entry_id=entry.entry_id,
                job_id=entry.fields.get("job"),
                detail=detail,
            )
        else:
            self.log.info(
                "entry.not_started",
                entry_id=entry.entry_id,
                job_id=entry.fields.get("job"),
                outcome=outcome,
                detail=detail,
            )

    async def _fail_unreadable(self, entry: StreamEntry, token: str, detail: str) -> None:
        finish = Finish(
            job_id=entry.fields["job"],
            stream=entry.stream,
            entry_id=entry.entry_id,
            token=token,
            target="failed",
            claim_key=entry.fields.get("claim", ""),
            event=EventType.FAILED.value,
            event_extra=events.failed_fields(CORRUPT_JOB_RECORD, detail, False),
            claim_status="FAILED",
            fields={
                "error_code": CORRUPT_JOB_RECORD,
                "error_message": detail,
                "error_retryable": "0",
            },
        )
        await self.queue.finish_many([finish])
        self.log.error("job.unreadable", job_id=entry.fields["job"], detail=detail)

    def _count_corrupt(self, entry: StreamEntry, detail: str) -> None:
        """take/start found a corrupt job record and dead-lettered it in the same script."""
        if self.metrics is not None:
            self.metrics.dead_letters.labels(entry.stream.value, "corrupt_job_record").inc()
        self.log.error(
            "job.corrupt_record_dead_lettered",
            entry_id=entry.entry_id,
            stream=entry.stream.value,
            detail=detail,
        )
