"""When the client tries a request again: pure policy (no I/O, no clock of its own).

429 and 503 are retried for every request (the gateway did nothing and says when to come
back); a lost connection, 502 and 504 only for requests that are safe to repeat (GET, and a
submit, which always carries an Idempotency-Key). `Retry-After` wins over the backoff; both
are jittered, bounded in attempts and by a total deadline.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

ALWAYS_RETRIED = frozenset({429, 503})
RETRIED_IF_SAFE = frozenset({0, 502, 504})  # 0: the gateway could not be reached


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """`attempts` tries in all (1 = no retries), exponential backoff from `base_s` capped at
    `cap_s`, and no retry that would end past `deadline_s` after the first try began."""

    attempts: int = 5
    base_s: float = 0.5
    cap_s: float = 30.0
    deadline_s: float = 120.0
    # Retry-After is honoured up to this; a longer one ends the retries (the caller decides).
    max_retry_after_s: float = 60.0

    def retryable(self, status: int, safe: bool) -> bool:
        return status in ALWAYS_RETRIED or (safe and status in RETRIED_IF_SAFE)

    def delay_s(
        self,
        attempt: int,
        retry_after_s: float | None,
        rand: Callable[[], float] = random.random,
    ) -> float | None:
        """Seconds to wait before try `attempt + 1` (after `attempt` failed tries, from 1), or
        None when no further try is allowed."""
        if attempt >= self.attempts:
            return None
        if retry_after_s is not None:
            if retry_after_s > self.max_retry_after_s:
                return None
            # A little on top, so clients told the same Retry-After do not return together.
            return retry_after_s + rand() * min(1.0, 0.1 * max(retry_after_s, 1.0))
        step = min(self.cap_s, self.base_s * 2.0 ** (attempt - 1))
        return step / 2 + rand() * step / 2  # "equal jitter": at least half the step

    def within_deadline(self, elapsed_s: float, delay_s: float) -> bool:
        return elapsed_s + delay_s <= self.deadline_s


NO_RETRIES = RetryPolicy(attempts=1)


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """RFC 9110 `Retry-After`: delay-seconds or an HTTP-date; None when absent or invalid."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return seconds if seconds >= 0 else None
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())
