"""Cron schedules in UTC (croniter parses them; five fields, or six with seconds first).

Pure: which scheduled slot is due now, when the next one comes, how far apart they are. A run
covers the latest slot at or before now; slots missed while nothing ran are not run one by
one: the next run covers the latest of them (a missed schedule is caught up once).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from croniter import croniter


class ScheduleError(ValueError):
    """A cron expression that cannot be used."""


@dataclass(frozen=True, slots=True)
class Schedule:
    expression: str

    def __post_init__(self) -> None:
        fields = self.expression.split()
        if len(fields) not in {5, 6} or not croniter.is_valid(
            self.expression, second_at_beginning=len(fields) == 6
        ):
            raise ScheduleError(
                f"not a cron expression (5 fields, or 6 with seconds first): {self.expression!r}"
            )

    def _iter(self, at_s: float) -> croniter:
        start = datetime.fromtimestamp(at_s, UTC)
        six = len(self.expression.split()) == 6
        return croniter(self.expression, start, second_at_beginning=six)

    def latest_slot(self, now_s: float) -> float:
        """The latest scheduled time at or before `now_s` (Unix seconds)."""
        it = self._iter(now_s + 0.001)
        return float(it.get_prev(float))

    def next_slot(self, now_s: float) -> float:
        """The first scheduled time after `now_s`."""
        return float(self._iter(now_s).get_next(float))

    def interval_s(self, now_s: float) -> float:
        """Seconds between the next two slots (the dead man's switch allows two of them)."""
        first = self.next_slot(now_s)
        return self.next_slot(first) - first
