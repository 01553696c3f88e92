"""Prometheus metrics of the engine.

`QueueMetrics` mirrors Redis state (depth, lag, oldest waiting and pending ages, jobs per
state): any service that samples the queues registers it (the gateway, the worker).
`EngineMetrics` is the worker's: deliveries, reclaims, dead letters, lease renewal failures,
retries by code, and the SLO histograms (queue wait and end-to-end time per stream and
quality); it holds a `QueueMetrics` for its own sampler. `register_build_info` is every
service's `splatq_build_info`.

Definitions, observation helpers and a sampler only; nothing here decides anything about jobs.
"""

from __future__ import annotations

import contextlib
import platform
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, Info

from splatq.shared import __version__
from splatq.shared.engine.jobs import JobRecord
from splatq.shared.engine.keys import STREAMS, StreamName
from splatq.shared.engine.queue import JobQueue
from splatq.shared.engine.stages import ALL_STAGES, FIRST_STAGE, PIPELINE, PipelineStage
from splatq.shared.engine.states import JobStatus
from splatq.shared.engine.tenant_metrics import TenantMetrics

_DURATION_BUCKETS = (0.005, 0.025, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
# Queue wait and end-to-end time: from sub-second (an idle interactive worker) to hours (a
# synthesis backlog).
_SLO_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200)
# The outcomes that end a job: end-to-end time is observed for these only.
TERMINAL_OUTCOMES = frozenset({"completed", "failed", "canceled"})
# The states a job can be counted in from Redis structures alone (terminal ones are counted
# by `splatq_jobs_total{outcome}` as they happen).
LIVE_STATES = (JobStatus.QUEUED, JobStatus.PROCESSING, JobStatus.RETRYING)
_LABEL_VALUE = re.compile(r"[a-z0-9_-]{1,32}")


def quality_label(quality: str) -> str:
    """A job's quality as a label value; anything unexpected is `other` (bounded series)."""
    return quality if _LABEL_VALUE.fullmatch(quality) else "other"


def package_version() -> str:
    return __version__  # one source: splatq.shared (the installed package's metadata)


def register_build_info(registry: CollectorRegistry = REGISTRY, service: str = "") -> None:
    """`splatq_build_info{version, python, service} 1` on `registry`."""
    Info(
        "splatq_build", "splatq build: package version, Python version, service", registry=registry
    ).info({"version": package_version(), "python": platform.python_version(), "service": service})


@dataclass(frozen=True, slots=True)
class QueueMetrics:
    """Gauges that mirror Redis state; refreshed by `sample` (every few seconds)."""

    queue_depth: Gauge
    pending: Gauge
    group_lag: Gauge
    oldest_pending_age: Gauge
    oldest_waiting_age: Gauge
    jobs_in_state: Gauge
    delayed: Gauge
    dead_letter_length: Gauge
    events_length: Gauge
    lost_entries: Gauge
    stage_depth: Gauge
    stage_running: Gauge
    stage_oldest_waiting_age: Gauge

    @classmethod
    def create(cls, registry: CollectorRegistry = REGISTRY) -> QueueMetrics:
        sp = ["stream", "partition"]
        ssp = ["stage", "stream", "partition"]
        return cls(
            stage_depth=Gauge(
                "splatq_stage_depth",
                "Staged pipeline: jobs waiting for a worker of the stage (the ingest stage "
                "includes the tenants' fair queues; cleanup counts finished jobs)",
                ssp,
                registry=registry,
            ),
            stage_running=Gauge(
                "splatq_stage_running",
                "Staged pipeline: entries of the stage delivered and not yet acked",
                ssp,
                registry=registry,
            ),
            stage_oldest_waiting_age=Gauge(
                "splatq_stage_oldest_waiting_age_seconds",
                "Staged pipeline: age of the oldest entry waiting in the stage (0 when none)",
                ssp,
                registry=registry,
            ),
            queue_depth=Gauge(
                "splatq_queue_depth",
                "Jobs waiting for a worker: in the tenants' fair queues, or in the stream and "
                "not yet delivered",
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
                "XINFO GROUPS lag (absent while Redis cannot tell)",
                sp,
                registry=registry,
            ),
            oldest_pending_age=Gauge(
                "splatq_oldest_pending_age_seconds",
                "Age of the oldest delivered but unacked entry (running jobs)",
                sp,
                registry=registry,
            ),
            oldest_waiting_age=Gauge(
                "splatq_oldest_waiting_age_seconds",
                "Age of the oldest job waiting for a worker (fair queue or undelivered stream "
                "entry; 0 when none waits)",
                sp,
                registry=registry,
            ),
            jobs_in_state=Gauge(
                "splatq_jobs_in_state",
                "Jobs now queued (waiting entries), processing (delivered, unacked) or "
                "retrying (parked for a retry); terminal outcomes are splatq_jobs_total",
                ["state", "partition"],
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
        )

    async def sample(
        self, queue: JobQueue, partitions: tuple[int, ...], staged: bool = False
    ) -> None:
        """Refresh the gauges that mirror Redis state (called periodically), the pipeline
        stages' included (`staged` is accepted for callers that say so; every sampler reads
        the stages, so a gateway and a worker report the same)."""
        # The entry streams' gauges read the same whoever samples them: a staged worker's own
        # queue reads its stage's streams (a GPU pod's is reconstruct's), so go through the
        # first stage's queue, which reads the entry streams.
        if queue.stage is not None:
            queue = queue.for_stage(FIRST_STAGE)
        for p in partitions:
            label = str(p)
            waiting = running = 0
            for stream in STREAMS:
                s = await queue.stream_stats(p, stream)
                # Waiting: in the tenants' fair queues, or in the stream but not delivered.
                fair = await queue.waiting(p, stream)
                depth = max(s.length - s.pending, 0) + fair.waiting
                waiting += depth
                running += s.pending
                self.queue_depth.labels(stream.value, label).set(depth)
                self.pending.labels(stream.value, label).set(s.pending)
                if s.lag is None:
                    # No sentinel: the series is absent while Redis cannot tell.
                    with contextlib.suppress(KeyError):
                        self.group_lag.remove(stream.value, label)
                else:
                    self.group_lag.labels(stream.value, label).set(s.lag)
                self.oldest_pending_age.labels(stream.value, label).set(s.oldest_pending_age_s)
                self.oldest_waiting_age.labels(stream.value, label).set(
                    max(s.oldest_waiting_age_s, fair.oldest_waiting_age_s)
                )
            # jobs between stages or in a later one are queued or processing too (every
            # sampler reads every stage, so all report the same values: max() across them)
            later_waiting, later_running = await self._sample_stages(queue, p)
            waiting += later_waiting
            running += later_running
            counts = await queue.partition_counts(p)
            self.jobs_in_state.labels(JobStatus.QUEUED.value, label).set(waiting)
            self.jobs_in_state.labels(JobStatus.PROCESSING.value, label).set(running)
            self.jobs_in_state.labels(JobStatus.RETRYING.value, label).set(counts["delayed"])
            self.delayed.labels(label).set(counts["delayed"])
            self.dead_letter_length.labels(label).set(counts["dead_letters"])
            self.events_length.labels(label).set(counts["events"])
            self.lost_entries.labels(label).set(counts["lost_entries"])

    async def _sample_stages(self, queue: JobQueue, partition: int) -> tuple[int, int]:
        """Set the stage gauges; returns the jobs waiting and running in the job stages after
        the first (the entry streams are counted by the caller; cleanup is not a job's)."""
        label = str(partition)
        later_waiting = later_running = 0
        for stage in ALL_STAGES:
            stage_queue = queue.for_stage(stage)
            for stream in STREAMS:
                s = await stage_queue.stream_stats(partition, stream)
                depth, running = max(s.length - s.pending, 0), s.pending
                oldest = s.oldest_waiting_age_s
                if stage == FIRST_STAGE:
                    fair = await queue.waiting(partition, stream)
                    depth += fair.waiting
                    oldest = max(oldest, fair.oldest_waiting_age_s)
                elif stage in PIPELINE:
                    later_waiting += depth
                    later_running += running
                self.stage_depth.labels(stage.value, stream.value, label).set(depth)
                self.stage_running.labels(stage.value, stream.value, label).set(running)
                self.stage_oldest_waiting_age.labels(stage.value, stream.value, label).set(oldest)
        return later_waiting, later_running


@dataclass(frozen=True, slots=True)
class EngineMetrics:
    """A worker's metrics (a gateway registers `QueueMetrics` only: no empty families)."""

    queues: QueueMetrics
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
    queue_wait: Histogram
    end_to_end: Histogram
    slots_in_use: Gauge
    slots_reserved: Gauge
    entries_lost_alarm: Counter
    stage_runs: Counter
    stage_duration: Histogram
    tenants: TenantMetrics

    @classmethod
    def create(
        cls,
        registry: CollectorRegistry = REGISTRY,
        top_tenants: int = 10,
        named_tenants: Iterable[str] = (),
    ) -> EngineMetrics:
        return cls(
            tenants=TenantMetrics.create(top_tenants, named_tenants, registry),
            queues=QueueMetrics.create(registry),
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
            queue_wait=Histogram(
                "splatq_job_queue_wait_duration_seconds",
                "Time from a job's creation to its first start (Redis clock)",
                ["stream", "quality"],
                buckets=_SLO_BUCKETS,
                registry=registry,
            ),
            end_to_end=Histogram(
                "splatq_job_end_to_end_duration_seconds",
                "Time from a job's creation to its final outcome, by outcome",
                ["stream", "quality", "outcome"],
                buckets=_SLO_BUCKETS,
                registry=registry,
            ),
            **_slot_and_stage_metrics(registry),
            entries_lost_alarm=Counter(
                "splatq_stream_entries_lost_total",
                "ALARM: XAUTOCLAIM reported pending entries deleted from the stream",
                ["stream"],
                registry=registry,
            ),
        )

    async def sample_queues(
        self, queue: JobQueue, partitions: tuple[int, ...], staged: bool = False
    ) -> None:
        await self.queues.sample(queue, partitions, staged)
        await self.tenants.sample(queue, partitions)

    def observe_started(self, job: JobRecord) -> None:
        """Queue wait, once per job: at its first delivery (a retry or a re-delivery after a
        worker's death is not waiting in the queue again)."""
        first_stage = job.current_stage in ("", FIRST_STAGE.value)
        if first_stage and job.deliveries <= 1 and job.started_at_ms is not None:
            wait_s = max(job.started_at_ms - job.created_at_ms, 0) / 1000
            self.queue_wait.labels(job.stream.value, quality_label(job.quality)).observe(wait_s)

    def observe_run(
        self,
        job: JobRecord,
        stream: StreamName,
        stage: PipelineStage | None,
        outcome: str,
        run_s: float,
    ) -> None:
        """One run's end: its outcome and duration, per stream and (for a stage's run) per
        stage, and the job's end-to-end time when the outcome is final."""
        self.jobs.labels(stream.value, outcome).inc()
        self.job_duration.labels(stream.value, outcome).observe(run_s)
        self.observe_finished(job, outcome, run_s)
        if stage is not None:
            labels = (stage.value, stream.value, outcome)
            self.stage_runs.labels(*labels).inc()
            self.stage_duration.labels(*labels).observe(run_s)

    def observe_finished(self, job: JobRecord, outcome: str, run_s: float) -> None:
        """End-to-end time of a job that reached a final outcome; `run_s` is this run's
        time since its start (the worker's monotonic clock, so no clock skew enters)."""
        if outcome in TERMINAL_OUTCOMES:
            self.tenants.finished(job.tenant, outcome)
        if outcome in TERMINAL_OUTCOMES and job.started_at_ms is not None:
            total_s = max(job.started_at_ms - job.created_at_ms, 0) / 1000 + run_s
            self.end_to_end.labels(job.stream.value, quality_label(job.quality), outcome).observe(
                total_s
            )


def _slot_and_stage_metrics(registry: CollectorRegistry) -> dict[str, Any]:
    """EngineMetrics' slot gauges and staged-pipeline series."""
    return {
        "slots_in_use": Gauge(
            "splatq_slots_in_use", "Worker slots running jobs", ["stream"], registry=registry
        ),
        "slots_reserved": Gauge(
            "splatq_slots_reserved",
            "Worker slots reserved per stream",
            ["stream"],
            registry=registry,
        ),
        "stage_runs": Counter(
            "splatq_stage_runs_total",
            "Staged pipeline: stage runs ended by this worker, by outcome (advanced, "
            "completed, retrying, failed, canceled, lease_lost, released)",
            ["stage", "stream", "outcome"],
            registry=registry,
        ),
        "stage_duration": Histogram(
            "splatq_stage_duration_seconds",
            "Staged pipeline: a stage run's time from its start to its commit",
            ["stage", "stream", "outcome"],
            buckets=_DURATION_BUCKETS,
            registry=registry,
        ),
    }
