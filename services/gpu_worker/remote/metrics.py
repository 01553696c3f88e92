"""Prometheus metrics of remote model backends: upstream latency, answers by outcome and code,
429s and lane pauses, permit waits, slots and the circuit. Definitions only.

The lane gauges (`splatq_upstream_slots_in_use`, `_waiting`, `_breaker_open`) are the whole
fleet's, sampled from Redis by every worker process: aggregate them with max(), not sum().
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1800)


@dataclass(frozen=True, slots=True)
class UpstreamMetrics:
    latency: Histogram
    answers: Counter
    throttled: Counter
    pauses: Counter
    deferrals: Counter
    permit_wait: Histogram
    slots_in_use: Gauge
    slots_held_here: Gauge
    waiting: Gauge
    breaker_open: Gauge
    breaker_opened: Counter
    cancels: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry = REGISTRY) -> UpstreamMetrics:
        v = ["vendor"]
        return cls(
            latency=Histogram(
                "splatq_upstream_latency_seconds",
                "Upstream latency: a create call's answer, or a prediction from creation to end",
                ["vendor", "phase"],
                buckets=LATENCY_BUCKETS,
                registry=registry,
            ),
            answers=Counter(
                "splatq_upstream_answers_total",
                "Vendor answers by outcome (ok, slow_down, transient, permanent) and code",
                ["vendor", "call", "outcome", "code"],
                registry=registry,
            ),
            throttled=Counter(
                "splatq_upstream_throttled_total",
                "429 (or 503 with Retry-After) answers from the vendor",
                v,
                registry=registry,
            ),
            pauses=Counter(
                "splatq_upstream_lane_pauses_total",
                "Times this process paused the vendor's whole lane (Retry-After)",
                v,
                registry=registry,
            ),
            deferrals=Counter(
                "splatq_upstream_deferrals_total",
                "Jobs put back on the delayed set (no attempt counted), by reason",
                ["vendor", "reason"],
                registry=registry,
            ),
            permit_wait=Histogram(
                "splatq_upstream_permit_wait_seconds",
                "Time a call waited for the fleet-wide limiter's permit",
                v,
                buckets=(0.001, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
                registry=registry,
            ),
            slots_in_use=Gauge(
                "splatq_upstream_slots_in_use",
                "Vendor concurrency slots held by the whole fleet (sampled from Redis)",
                v,
                registry=registry,
            ),
            slots_held_here=Gauge(
                "splatq_upstream_slots_held",
                "Vendor concurrency slots this process holds",
                v,
                registry=registry,
            ),
            waiting=Gauge(
                "splatq_upstream_waiting",
                "Calls waiting in the vendor's fleet-wide line (sampled from Redis)",
                v,
                registry=registry,
            ),
            breaker_open=Gauge(
                "splatq_upstream_breaker_open",
                "1 while the vendor's circuit is open (sampled from Redis), else 0",
                v,
                registry=registry,
            ),
            breaker_opened=Counter(
                "splatq_upstream_breaker_opened_total",
                "Times a report from this process opened the vendor's circuit",
                v,
                registry=registry,
            ),
            cancels=Counter(
                "splatq_upstream_cancels_total",
                "Cancels forwarded to the vendor, by its answer",
                ["vendor", "outcome"],
                registry=registry,
            ),
        )
