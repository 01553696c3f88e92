"""Prometheus metrics of the webhook dispatcher: attempts by outcome and status class,
attempt latency, messages waiting and how late, dead letters, circuit breaker state.
Definitions only."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram


@dataclass(frozen=True, slots=True)
class DispatcherMetrics:
    attempts: Counter
    attempt_seconds: Histogram
    pending: Gauge
    dead_letters: Gauge
    due_lag: Gauge
    deferred: Counter
    circuit_transitions: Counter
    open_circuits: Gauge

    @classmethod
    def create(cls, registry: CollectorRegistry = REGISTRY) -> DispatcherMetrics:
        return cls(
            attempts=Counter(
                "splatq_webhook_attempts_total",
                "Webhook delivery attempts",
                ["outcome", "status_class"],
                registry=registry,
            ),
            attempt_seconds=Histogram(
                "splatq_webhook_attempt_duration_seconds",
                "Webhook attempt latency",
                registry=registry,
                buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            ),
            pending=Gauge(
                "splatq_webhook_messages_pending",
                "Messages waiting for an attempt (due set size)",
                ["partition"],
                registry=registry,
            ),
            dead_letters=Gauge(
                "splatq_webhook_dead_letter_length",
                "Entries in the webhook dead-letter stream",
                ["partition"],
                registry=registry,
            ),
            due_lag=Gauge(
                "splatq_webhook_due_lag_seconds",
                "How late the most overdue message is (0 when none is overdue)",
                ["partition"],
                registry=registry,
            ),
            deferred=Counter(
                "splatq_webhook_deferred_total",
                "Messages held back without an attempt: circuit_open, or target_busy (the "
                "endpoint already had its share of attempts in flight)",
                ["reason"],
                registry=registry,
            ),
            circuit_transitions=Counter(
                "splatq_webhook_circuit_transitions_total",
                "Endpoint circuit changes seen by this dispatcher (open, closed, disabled)",
                ["to"],
                registry=registry,
            ),
            open_circuits=Gauge(
                "splatq_webhook_open_circuits",
                "Endpoints whose circuit this dispatcher last saw open",
                registry=registry,
            ),
        )
