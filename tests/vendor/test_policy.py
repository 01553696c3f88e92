"""What a vendor's answer means (pure): stable codes per HTTP status, Retry-After, messages
made safe for a job record and a log, the quota charge, idempotency keys, poll backoff."""

from __future__ import annotations

import random

import pytest

from splatq.shared.vendor.policy import (
    MAX_MESSAGE_CHARS,
    Kind,
    charge,
    classify_status,
    idempotency_key,
    parse_retry_after,
    poll_delays,
    sanitize,
)


@pytest.mark.parametrize(
    ("status", "retry_after", "kind", "code"),
    [
        (429, 3.0, Kind.SLOW_DOWN, "UPSTREAM_RATE_LIMITED"),
        (429, None, Kind.SLOW_DOWN, "UPSTREAM_RATE_LIMITED"),
        (503, 5.0, Kind.SLOW_DOWN, "UPSTREAM_RATE_LIMITED"),
        (503, None, Kind.TRANSIENT, "UPSTREAM_ERROR"),
        (500, None, Kind.TRANSIENT, "UPSTREAM_ERROR"),
        (502, 1.0, Kind.TRANSIENT, "UPSTREAM_ERROR"),
        (504, None, Kind.TRANSIENT, "UPSTREAM_TIMEOUT"),
        (408, None, Kind.TRANSIENT, "UPSTREAM_TIMEOUT"),
        (400, None, Kind.PERMANENT, "UPSTREAM_REJECTED"),
        (422, None, Kind.PERMANENT, "UPSTREAM_REJECTED"),
        (401, None, Kind.PERMANENT, "UPSTREAM_AUTH"),
        (403, None, Kind.PERMANENT, "UPSTREAM_AUTH"),
        (404, None, Kind.PERMANENT, "UPSTREAM_REJECTED"),
    ],
)
def test_each_status_has_its_kind_and_code(
    status: int, retry_after: float | None, kind: Kind, code: str
) -> None:
    """429 and 503+Retry-After slow the lane down; 5xx/408 are transient; 4xx permanent."""
    verdict = classify_status(status, retry_after, "msg")
    assert (verdict.kind, verdict.code) == (kind, code)
    if kind is Kind.SLOW_DOWN:
        assert verdict.retry_after_s == (retry_after if retry_after is not None else 2.0)
        assert verdict.breaker_outcome == "slow_down"
    elif kind is Kind.TRANSIENT:
        assert verdict.breaker_outcome == "failure"
    else:
        assert verdict.breaker_outcome == "success"  # the vendor is up: it answered


def test_retry_after_in_seconds_or_as_a_date_bounded() -> None:
    """Delta-seconds and HTTP dates are read; garbage is None; a huge value is an hour."""
    now = 1_700_000_000.0
    assert parse_retry_after("7", now) == 7.0
    assert parse_retry_after("1.5", now) == 1.5
    assert parse_retry_after("Tue, 14 Nov 2023 22:13:40 GMT", now) == pytest.approx(20.0)
    assert parse_retry_after("Tue, 14 Nov 2023 22:00:00 GMT", now) == 0.0
    assert parse_retry_after("soon", now) is None
    assert parse_retry_after("", now) is None
    assert parse_retry_after("99999999", now) == 3600.0


def test_a_vendor_message_is_made_safe() -> None:
    """No control characters (a forged log line), no secret, nothing shaped like a bearer
    token, whitespace collapsed, at most MAX_MESSAGE_CHARS."""
    secret = "r8_" + "k" * 30
    text = f"bad\x1b[2J\r\nINFO forged line {secret} Bearer abcdefghijklmnop0123 " + "y" * 900
    safe = sanitize(text, [secret])
    assert secret not in safe
    assert "abcdefghijklmnop0123" not in safe
    assert not any(ord(c) < 32 for c in safe)
    assert len(safe) <= MAX_MESSAGE_CHARS
    assert safe.startswith("bad [2J INFO forged line <redacted> Bearer <redacted>")


def test_the_charge_prefers_cost_then_vendor_time_then_latency() -> None:
    """The quota is settled on the vendor's reported cost (with a rate), else its reported
    compute time, else the latency measured here."""
    assert charge(2.5, 0.04, 100_000, 9000).ms == 4000
    assert charge(2.5, 0.04, 100_000, 9000).basis == "cost"
    assert (charge(2.5, 0.04, 0, 9000).ms, charge(2.5, None, 0, 9000).basis) == (
        2500,
        "vendor_time",
    )
    assert (charge(None, None, 0, 9000).ms, charge(None, None, 0, 9000).basis) == (9000, "latency")
    assert charge(float("nan"), None, 0, 10).basis == "latency"


def test_idempotency_keys_are_stable_per_job_call_input_and_failure() -> None:
    """Every run of one call on one input sends the same key; a new one after a failed
    prediction (sequence), another input or another call."""
    key = idempotency_key("job_1", "full", "d1", 0)
    assert key == idempotency_key("job_1", "full", "d1", 0)
    others = {
        idempotency_key("job_1", "full", "d1", 1),
        idempotency_key("job_1", "full", "d2", 0),
        idempotency_key("job_1", "preview", "d1", 0),
        idempotency_key("job_2", "full", "d1", 0),
    }
    assert key not in others
    assert len(others) == 4


def test_polls_back_off_to_the_cap_with_jitter() -> None:
    """Delays grow by the factor up to the cap, each within +-20 %."""
    delays = poll_delays(0.5, 5.0, 2.0, random.Random(1))
    got = [next(delays) for _ in range(8)]
    expected = [0.5, 1.0, 2.0, 4.0, 5.0, 5.0, 5.0, 5.0]
    assert all(0.8 * e <= g <= 1.2 * e for g, e in zip(got, expected, strict=True))
