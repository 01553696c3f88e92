"""Retry policy: exponential backoff with full jitter, and the retry-or-fail decision.

Pure functions; the delay is applied through the durable delayed set, never by sleeping.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from splatq.shared.errors import ErrorInfo


def full_jitter_ms(attempt: int, base_ms: int, cap_ms: int, rng: random.Random) -> int:
    """`random(0, min(cap, base * 2**attempt))` (AWS "full jitter"); attempt counts from 1."""
    exponent = max(attempt - 1, 0)
    # Bound the exponent before shifting so a huge attempt count cannot build a huge int.
    ceiling = cap_ms if exponent >= 62 else min(cap_ms, base_ms << exponent)
    return int(rng.uniform(0, ceiling))


@dataclass(frozen=True, slots=True)
class RetryDecision:
    retry: bool
    delay_ms: int = 0


def decide_retry(
    error: ErrorInfo,
    attempt: int,
    max_attempts: int,
    base_ms: int,
    cap_ms: int,
    rng: random.Random,
) -> RetryDecision:
    """Retry transient errors until `max_attempts` attempts were made; fail everything else."""
    if not error.retryable or attempt >= max_attempts:
        return RetryDecision(retry=False)
    return RetryDecision(retry=True, delay_ms=full_jitter_ms(attempt, base_ms, cap_ms, rng))
