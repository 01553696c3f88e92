"""Backoff with full jitter and the retry decision (pure)."""

from __future__ import annotations

import random

from splatq.shared.engine.retries import decide_retry, full_jitter_ms
from splatq.shared.errors import ErrorInfo, PermanentError, TransientError, classify


def test_full_jitter_stays_within_the_exponential_ceiling() -> None:
    """Every delay lies in [0, min(cap, base * 2**(attempt-1))]."""
    rng = random.Random(7)
    for attempt in range(1, 30):
        ceiling = min(60_000, 100 * 2 ** (attempt - 1))
        for _ in range(200):
            assert 0 <= full_jitter_ms(attempt, 100, 60_000, rng) <= ceiling


def test_full_jitter_spreads_delays() -> None:
    """Jitter is full: delays at one attempt cover the range instead of clustering."""
    rng = random.Random(1)
    delays = [full_jitter_ms(5, 100, 60_000, rng) for _ in range(2000)]
    assert min(delays) < 160
    assert max(delays) > 1440


def test_huge_attempt_counts_do_not_overflow() -> None:
    assert full_jitter_ms(10_000, 100, 5_000, random.Random(0)) <= 5_000


def test_permanent_errors_never_retry() -> None:
    info = classify(PermanentError("bad", code="INPUT_CORRUPT"))
    assert not decide_retry(info, 1, 5, 100, 1000, random.Random(0)).retry


def test_transient_errors_retry_until_max_attempts() -> None:
    info = classify(TransientError("slow", code="STORAGE_TIMEOUT"))
    rng = random.Random(0)
    assert decide_retry(info, 1, 3, 100, 1000, rng).retry
    assert decide_retry(info, 2, 3, 100, 1000, rng).retry
    assert not decide_retry(info, 3, 3, 100, 1000, rng).retry


def test_unknown_exceptions_are_transient_with_a_stable_code() -> None:
    """A bug is retried a few times (then fails) rather than failing a flaky dependency."""
    info = classify(ValueError("boom"))
    assert info == ErrorInfo("UNEXPECTED_ERROR", "ValueError: boom", True)
    assert classify(TimeoutError()).code == "TIMEOUT"
