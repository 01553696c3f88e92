"""What a vendor's answer means, in stable codes, and the small arithmetic around it. Pure.

- 429, and 503 with Retry-After: *slow down* -- the whole lane pauses until then and the job
  waits without an attempt counted: the vendor said "later", the job did nothing wrong.
- timeouts, resets, other 5xx (and 408, 409): *transient* -- retried with full-jitter backoff,
  counted by the circuit breaker.
- 400/422 (the request or the input), 401/403 (the credentials) and the other 4xx:
  *permanent*, with the vendor's message sanitised and bounded.
"""

from __future__ import annotations

import email.utils
import hashlib
import math
import random
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from enum import StrEnum

# Stable error codes of remote backends (docs/hosted-model.md#errors).
UPSTREAM_RATE_LIMITED = "UPSTREAM_RATE_LIMITED"
UPSTREAM_UNAVAILABLE = "UPSTREAM_UNAVAILABLE"  # the circuit stayed open past the bounded wait
UPSTREAM_TIMEOUT = "UPSTREAM_TIMEOUT"
UPSTREAM_CONNECTION = "UPSTREAM_CONNECTION"
UPSTREAM_ERROR = "UPSTREAM_ERROR"
UPSTREAM_REJECTED = "UPSTREAM_REJECTED"
UPSTREAM_AUTH = "UPSTREAM_AUTH"
UPSTREAM_BAD_RESPONSE = "UPSTREAM_BAD_RESPONSE"
UPSTREAM_PREDICTION_FAILED = "UPSTREAM_PREDICTION_FAILED"
UPSTREAM_PREDICTION_CANCELED = "UPSTREAM_PREDICTION_CANCELED"
UPSTREAM_PREDICTION_LOST = "UPSTREAM_PREDICTION_LOST"
UPSTREAM_OUTPUT_INVALID = "UPSTREAM_OUTPUT_INVALID"
UPSTREAM_OUTPUT_UNSUPPORTED = "UPSTREAM_OUTPUT_UNSUPPORTED"
UPSTREAM_OUTPUT_TOO_LARGE = "UPSTREAM_OUTPUT_TOO_LARGE"

MAX_MESSAGE_CHARS = 300
# A Retry-After beyond this is taken as this (a vendor's typo must not park a lane for days).
MAX_RETRY_AFTER_S = 3600.0
# 429 without Retry-After: a short pause all the same (the vendor asked for less).
DEFAULT_SLOW_DOWN_S = 2.0


class Kind(StrEnum):
    SLOW_DOWN = "slow_down"
    TRANSIENT = "transient"
    PERMANENT = "permanent"


@dataclass(frozen=True, slots=True)
class Verdict:
    kind: Kind
    code: str
    message: str
    retry_after_s: float = 0.0

    @property
    def breaker_outcome(self) -> str:
        """What the circuit hears: a transient failure counts; a vendor that answered (a
        4xx, a 429) is up."""
        if self.kind is Kind.TRANSIENT:
            return "failure"
        return "slow_down" if self.kind is Kind.SLOW_DOWN else "success"


def parse_retry_after(value: str | None, now_s: float) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date), bounded; None when
    absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit() or re.fullmatch(r"\d+\.\d+", value):
        return min(float(value), MAX_RETRY_AFTER_S)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return min(max(0.0, when.timestamp() - now_s), MAX_RETRY_AFTER_S)


def classify_status(status: int, retry_after_s: float | None, message: str) -> Verdict:
    """An HTTP answer that is not a success (status >= 300)."""
    if status == 429:
        wait = DEFAULT_SLOW_DOWN_S if retry_after_s is None else retry_after_s
        return Verdict(Kind.SLOW_DOWN, UPSTREAM_RATE_LIMITED, message, wait)
    if status == 503 and retry_after_s is not None:
        return Verdict(Kind.SLOW_DOWN, UPSTREAM_RATE_LIMITED, message, retry_after_s)
    if status >= 500 or status in (408, 409, 425):
        code = UPSTREAM_TIMEOUT if status in (408, 504) else UPSTREAM_ERROR
        return Verdict(Kind.TRANSIENT, code, f"HTTP {status}: {message}")
    if status in (401, 403):
        return Verdict(Kind.PERMANENT, UPSTREAM_AUTH, f"HTTP {status}: {message}")
    return Verdict(Kind.PERMANENT, UPSTREAM_REJECTED, f"HTTP {status}: {message}")


def transport_verdict(kind: str, detail: str) -> Verdict:
    """A call that got no answer: `timeout` (no answer in time) or `connection` (refused,
    reset, a body cut short)."""
    code = UPSTREAM_TIMEOUT if kind == "timeout" else UPSTREAM_CONNECTION
    return Verdict(Kind.TRANSIENT, code, detail)


_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")
_BEARER = re.compile(r"(?i)\b(bearer|key|token)\s+[A-Za-z0-9._~+/=-]{8,}")


def sanitize(message: str, secrets: Iterable[str] = ()) -> str:
    """A vendor's message fit for a job record and a log: no control characters (no forged
    log lines), no secret (ours, or anything shaped like a bearer token), bounded."""
    text = _CONTROL.sub(" ", message)
    for secret in secrets:
        if secret:
            text = text.replace(secret, "<redacted>")
    text = _BEARER.sub(lambda m: f"{m.group(1)} <redacted>", text)
    text = " ".join(text.split())
    if len(text) > MAX_MESSAGE_CHARS:
        text = text[: MAX_MESSAGE_CHARS - 1] + "…"
    return text


def poll_delays(
    initial_s: float, max_s: float, factor: float, rng: random.Random
) -> Iterator[float]:
    """Seconds between polls of one prediction: growing by `factor` up to `max_s`, each
    jittered by ±20 % so that predictions created together are not polled together."""
    delay = initial_s
    while True:
        yield delay * rng.uniform(0.8, 1.2)
        delay = min(max_s, delay * factor)


def jittered_until(until_ms: int, pause_ms: int, jitter: float, rng: random.Random) -> int:
    """When one waiter resumes after a pause that ends at `until_ms`: up to `jitter` of the
    pause later, so the whole fleet does not ask at the same instant."""
    return until_ms + int(rng.uniform(0, max(0, pause_ms) * jitter))


def idempotency_key(job_id: str, call: str, input_digest: str, sequence: int) -> str:
    """The key a prediction is created under: the same for every run of one job's call on one
    input (a retry after a lost answer, a run that takes a killed one over), a new one after
    a prediction of it failed (`sequence` counts those)."""
    material = f"{job_id}|{call}|{input_digest}|{sequence}"
    return "splatq-" + hashlib.sha256(material.encode()).hexdigest()[:40]


@dataclass(frozen=True, slots=True)
class Charge:
    ms: int
    basis: str  # cost | vendor_time | latency


def charge(
    predict_time_s: float | None, cost: float | None, ms_per_cost: float, latency_ms: int
) -> Charge:
    """What the quota is charged for one prediction: the vendor's reported cost (times
    `ms_per_cost`) when it reports one and a rate is set, else its reported compute time,
    else the upstream latency we measured."""
    if cost is not None and ms_per_cost > 0 and math.isfinite(cost) and cost >= 0:
        return Charge(round(cost * ms_per_cost), "cost")
    if predict_time_s is not None and math.isfinite(predict_time_s) and predict_time_s >= 0:
        return Charge(round(predict_time_s * 1000), "vendor_time")
    return Charge(max(0, latency_ms), "latency")
