"""Prometheus metrics of the redriver and its scheduled tasks. Definitions only."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge


@dataclass(frozen=True, slots=True)
class RedriverMetrics:
    dead_letter_depth: Gauge
    dead_letter_oldest_age: Gauge
    redrives: Counter
    task_last_success: Gauge
    task_interval: Gauge
    task_runs: Counter
    expired_leases: Gauge
    stream_fill: Gauge
    retention_deleted: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry = REGISTRY) -> RedriverMetrics:
        return cls(
            dead_letter_depth=Gauge(
                "splatq_dead_letter_depth",
                "Dead letters by kind and reason (counted by the last whole policy sweep)",
                ["kind", "reason"],
                registry=registry,
            ),
            dead_letter_oldest_age=Gauge(
                "splatq_dead_letter_oldest_age_seconds",
                "Age of the oldest dead letter by kind and reason",
                ["kind", "reason"],
                registry=registry,
            ),
            redrives=Counter(
                "splatq_redrives_total",
                "Redrives by the redriver, by kind, policy and outcome (redriven, gone, "
                "not_redrivable, error)",
                ["kind", "policy", "outcome"],
                registry=registry,
            ),
            task_last_success=Gauge(
                "splatq_task_last_success_timestamp_seconds",
                "When each scheduled task last succeeded (read from Redis: the same on every "
                "replica; 0 = never)",
                ["task"],
                registry=registry,
            ),
            task_interval=Gauge(
                "splatq_task_interval_seconds",
                "Seconds between two scheduled runs of each task (the dead man's switch allows "
                "two)",
                ["task"],
                registry=registry,
            ),
            task_runs=Counter(
                "splatq_task_runs_total",
                "Task runs finished by this replica, by outcome",
                ["task", "outcome"],
                registry=registry,
            ),
            expired_leases=Gauge(
                "splatq_expired_leases_unreclaimed",
                "Jobs processing under a lease expired for longer than the reaper needs to "
                "take them over (must stay 0)",
                ["partition"],
                registry=registry,
            ),
            stream_fill=Gauge(
                "splatq_stream_fill_ratio",
                "Stream length over its MAXLEN cap (trimming starts at 1)",
                ["stream", "partition"],
                registry=registry,
            ),
            retention_deleted=Counter(
                "splatq_retention_deleted_total",
                "Objects deleted by the retention task, by kind (input, artifact)",
                ["kind"],
                registry=registry,
            ),
        )
