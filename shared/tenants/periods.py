"""Quota periods in UTC: which period an instant is in, and when that period ends. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum


class Period(StrEnum):
    DAY = "day"
    MONTH = "month"


@dataclass(frozen=True, slots=True)
class PeriodWindow:
    period: Period
    id: str  # e.g. d2026-12-01, m2026-12 (part of the usage key)
    starts_ms: int
    resets_ms: int  # when the next period begins


def _ms(at: datetime) -> int:
    return int(at.timestamp() * 1000)


def window(period: Period, now_ms: int) -> PeriodWindow:
    now = datetime.fromtimestamp(now_ms / 1000, tz=UTC)
    if period is Period.DAY:
        start = datetime(now.year, now.month, now.day, tzinfo=UTC)
        end = start + timedelta(days=1)
        return PeriodWindow(period, f"d{start:%Y-%m-%d}", _ms(start), _ms(end))
    start = datetime(now.year, now.month, 1, tzinfo=UTC)
    end = datetime(now.year + now.month // 12, now.month % 12 + 1, 1, tzinfo=UTC)
    return PeriodWindow(period, f"m{start:%Y-%m}", _ms(start), _ms(end))
