"""Delivery policy of the webhook dispatcher: which events go out, and what an HTTP answer
(or a failure to get one) means for the message. Pure functions; no I/O."""

from __future__ import annotations

import random
from dataclasses import dataclass

from splatq.shared.engine.events import TERMINAL_EVENTS
from splatq.shared.engine.retries import full_jitter_ms

TRANSIENT_STATUSES = frozenset({408, 429, 502, 503, 504})


def should_deliver(event_type: str, subscribed: tuple[str, ...]) -> bool:
    """A job's `webhook_url`: everything when no filter was given; terminal events always
    (the contract)."""
    return not subscribed or event_type in subscribed or event_type in TERMINAL_EVENTS


def endpoint_wants(event_type: str, subscribed: tuple[str, ...]) -> bool:
    """A registered endpoint: exactly the event types it subscribed to (none = all)."""
    return not subscribed or event_type in subscribed


def defer_delay_ms(until_ms: int, now_ms: int, rng: random.Random, spread_ms: int = 500) -> int:
    """Wait for an open circuit's probe time, spread so deferred messages do not all wake
    together."""
    return max(0, until_ms - now_ms) + rng.randint(0, spread_ms)


def tenant_limit(slots: int, share: float, tenants_in_flight: int) -> int:
    """The most attempts one tenant may have in flight: its share of the dispatcher's slots
    (the rest stay free, so another tenant's first message never waits for a slot), and no
    more than an even split while several tenants have attempts in flight. At least one."""
    cap = int(slots * share)
    even = slots // max(1, tenants_in_flight)
    return max(1, min(cap, even))


@dataclass(frozen=True, slots=True)
class Decision:
    outcome: str  # delivered | retry | failed
    delay_ms: int = 0
    reason: str = ""
    # Why a message failed, as a stable code (the dead-letter entry's `reason`):
    # exhausted | refused | gone | blocked | endpoint_disabled
    code: str = ""
    # What the attempt says about the endpoint's health: ok | fail | gone
    health: str = "fail"


def retry_or_fail(
    reason: str,
    attempt: int,
    max_attempts: int,
    base_ms: int,
    cap_ms: int,
    rng: random.Random,
    not_before_ms: int = 0,
) -> Decision:
    """Back off with full jitter (but never sooner than a Retry-After), or give up."""
    if attempt >= max_attempts:
        return Decision(
            "failed", reason=f"{reason}; gave up after {attempt} attempts", code="exhausted"
        )
    delay = max(full_jitter_ms(attempt, base_ms, cap_ms, rng), not_before_ms)
    return Decision("retry", delay_ms=delay, reason=reason)


def parse_retry_after_ms(value: str | None, cap_ms: int) -> int:
    """Retry-After in seconds (the HTTP-date form is treated as absent), capped."""
    if not value or not value.strip().isdigit():
        return 0
    return min(int(value.strip()) * 1000, cap_ms)


def classify_response(
    status: int,
    retry_after: str | None,
    attempt: int,
    max_attempts: int,
    base_ms: int,
    cap_ms: int,
    rng: random.Random,
) -> Decision:
    """2xx delivered; 410 gone (failed at once); 408/429/502/503/504 and any other 5xx or 3xx
    (redirects are never followed) retried, honouring Retry-After up to the cap; other 4xx
    failed at once (the receiver refuses this message)."""
    if 200 <= status < 300:
        return Decision("delivered", health="ok")
    if status == 410:
        return Decision(
            "failed",
            reason="410 gone: the receiver no longer wants deliveries",
            code="gone",
            health="gone",
        )
    if status in TRANSIENT_STATUSES or status >= 500 or 300 <= status < 400:
        return retry_or_fail(
            f"HTTP {status}",
            attempt,
            max_attempts,
            base_ms,
            cap_ms,
            rng,
            parse_retry_after_ms(retry_after, cap_ms),
        )
    return Decision("failed", reason=f"HTTP {status}: refused by the receiver", code="refused")
