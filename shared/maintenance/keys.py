"""Redis keys of the scheduler and the redriver. Each task has its own hash tag
`{task:<name>}` (its lock, state and history share one slot); audit trails hang off the key of
their subject (a job, a webhook message) by suffix, so they share its `{pN}` slot."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from splatq.shared.engine.keys import KeySchema


class DeadLetterKind(StrEnum):
    JOBS = "jobs"
    WEBHOOKS = "webhooks"


@dataclass(frozen=True, slots=True)
class MaintenanceKeys:
    schema: KeySchema

    def _task(self, name: str) -> str:
        return f"{self.schema.prefix}:{{task:{name}}}"

    def task_lock(self, name: str) -> str:
        return f"{self._task(name)}:lock"

    def task_state(self, name: str) -> str:
        return f"{self._task(name)}:state"

    def task_history(self, name: str) -> str:
        return f"{self._task(name)}:history"

    def redrive_bucket(self) -> str:
        """The global redrive token bucket (rate_limit.lua), its own slot."""
        return f"{self.schema.prefix}:{{redriver}}:bucket"

    def dead_letter_summary(self) -> str:
        """Depth and oldest age per (kind, reason), written by each sweep, read by every
        replica's metrics sampler."""
        return f"{self.schema.prefix}:{{redriver}}:dlq-summary"

    def dead_letters(self, kind: DeadLetterKind, partition: int) -> str:
        if kind is DeadLetterKind.WEBHOOKS:
            return self.schema.webhook_dead_letters(partition)
        return self.schema.dead_letters(partition)

    def audit(self, kind: DeadLetterKind, partition: int, subject: str, entry_id: str) -> str:
        """The audit trail of a dead letter's subject: `<job key>:audit`, `<message key>:audit`,
        or (an entry without a subject: a malformed one) one per entry."""
        if subject and kind is DeadLetterKind.JOBS:
            return f"{self.schema.job(subject)}:audit"
        if subject:
            return f"{self.schema.webhook_message(partition, subject)}:audit"
        return f"{self.dead_letters(kind, partition)}:audit:{entry_id}"
