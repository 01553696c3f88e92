"""Prometheus metrics of the engine: queue depth, lag, pending age, deliveries, reclaims,
dead letters, lease renewal failures, retries by code and job durations.

Definitions and a sampler only; nothing here decides anything about jobs.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from splatq.shared.engine.keys import STREAMS
from splatq.shared.engine.queue import JobQueue

_DURATION_BUCKETS = (0.005, 0.025, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)


@dataclass(frozen=True, slots=True)
class EngineMetrics:
    queue_depth: Gauge
    pending: Gauge
    group_lag: Gauge
    oldest_pending_age: Gauge
    delayed: Gauge
    dead_letter_length: Gauge
    events_length: Gauge
    lost_entries: Gauge
    deliveries: Counter
    reclaims: Counter
    lease_lapses: Counter
    delivery_charge: Histogram
    dead_letters: Counter
    lease_renewal_failures: Counter
    error_replies: Counter
    retries: Counter
    jobs: Counter
    job_duration: Histogram
    slots_in_use: Gauge
    slots_reserved: Gauge
    entries_lost_alarm: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry = REGISTRY) -> EngineMetrics:
        sp = ["stream", "partition"]
        return cls(
            queue_depth=Gauge(
                "splatq_queue_depth",
                "Entries not yet delivered to any worker",
                sp,
                registry=registry,
            ),
            pending=Gauge(
                "splatq_queue_pending",
                "Entries delivered but not acked (PEL size)",
                sp,
                registry=registry,
            ),
            group_lag=Gauge(
                "splatq_consumer_group_lag",
                "XINFO GROUPS lag (-1 when Redis cannot tell)",
                sp,
                registry=registry,
            ),
            oldest_pending_age=Gauge(
                "splatq_oldest_pending_age_seconds",
                "Age of the oldest unacked entry",
                sp,
                registry=registry,
            ),
            delayed=Gauge(
                "splatq_delayed_jobs",
                "Jobs waiting for a retry",
                ["partition"],
                registry=registry,
            ),
            dead_letter_length=Gauge(
                "splatq_dead_letter_length",
                "Entries in the job dead-letter stream",
                ["partition"],
                registry=registry,
            ),
            events_length=Gauge(
                "splatq_events_stream_length",
                "Entries in the events (outbox) stream",
                ["partition"],
                registry=registry,
            ),
            lost_entries=Gauge(
                "splatq_lost_entries",
                "Pending entries found deleted from the stream "
                "(trimmed past unacked work); must stay 0",
                ["partition"],
                registry=registry,
            ),
            deliveries=Counter(
                "splatq_deliveries_total",
                "Entries delivered to this worker, by start outcome",
                ["stream", "outcome"],
                registry=registry,
            ),
            reclaims=Counter(
                "splatq_reclaims_total",
                "Entries taken over by the reaper, by outcome",
                ["stream", "outcome"],
                registry=registry,
            ),
            lease_lapses=Counter(
                "splatq_lease_lapses_total",
                "Leases found lapsed by a reaper, by cause: worker_death (charged 1/k to each of "
                "its k jobs), mass_death (several workers at once: charged nothing), "
                "redis_outage (within the fleet's outage credit: the holder keeps the job), "
                "stale (an entry whose job was not running)",
                ["stream", "cause"],
                registry=registry,
            ),
            delivery_charge=Histogram(
                "splatq_delivery_charge",
                "A job's delivery charge after a worker death (dead-lettered at "
                "SPLATQ_MAX_DELIVERIES)",
                buckets=(0.1, 0.25, 0.5, 1, 2, 3, 4, 5, 8),
                registry=registry,
            ),
            dead_letters=Counter(
                "splatq_dead_letters_total",
                "Entries moved to the dead-letter stream",
                ["stream", "reason"],
                registry=registry,
            ),
            lease_renewal_failures=Counter(
                "splatq_lease_renewal_failures_total",
                "Lease renewals that failed",
                ["reason"],
                registry=registry,
            ),
            error_replies=Counter(
                "splatq_redis_error_replies_total",
                "Error replies (OOM, READONLY, script errors) a worker survived, by where",
                ["where", "kind"],
                registry=registry,
            ),
            retries=Counter(
                "splatq_retries_total",
                "Jobs parked for a retry, by error code",
                ["stream", "code"],
                registry=registry,
            ),
            jobs=Counter(
                "splatq_jobs_total",
                "Jobs finished by this worker, by outcome",
                ["stream", "outcome"],
                registry=registry,
            ),
            job_duration=Histogram(
                "splatq_job_duration_seconds",
                "Handler time from start to commit",
                ["stream", "outcome"],
                buckets=_DURATION_BUCKETS,
                registry=registry,
            ),
            slots_in_use=Gauge(
                "splatq_slots_in_use",
                "Worker slots running jobs",
                ["stream"],
                registry=registry,
            ),
            slots_reserved=Gauge(
                "splatq_slots_reserved",
                "Worker slots reserved per stream",
                ["stream"],
                registry=registry,
            ),
            entries_lost_alarm=Counter(
                "splatq_stream_entries_lost_total",
                "ALARM: XAUTOCLAIM reported pending entries deleted from the stream",
                ["stream"],
                registry=registry,
            ),
        )

    async def sample_queues(self, queue: JobQueue, partitions: tuple[int, ...]) -> None:
        """Refresh the gauges that mirror Redis state (called periodically)."""
        for p in partitions:
            label = str(p)
            for stream in STREAMS:
                s = await queue.stream_stats(p, stream)
                self.queue_depth.labels(stream.value, label).set(max(s.length - s.pending, 0))
                self.pending.labels(stream.value, label).set(s.pending)
                self.group_lag.labels(stream.value, label).set(-1 if s.lag is None else s.lag)
                self.oldest_pending_age.labels(stream.value, label).set(s.oldest_pending_age_s)
            counts = await queue.partition_counts(p)
            self.delayed.labels(label).set(counts["delayed"])
            self.dead_letter_length.labels(label).set(counts["dead_letters"])
            self.events_length.labels(label).set(counts["events"])
            self.lost_entries.labels(label).set(counts["lost_entries"])
