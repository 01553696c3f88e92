"""The settings of the queue and its workers: streams and fair scheduling; leases, retries
and retention; worker slots and the staged pipeline. Each declared once
(shared/settings/declare.py); `Settings` inherits them all."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from splatq.shared.config.vocabulary import DEFAULT_COSTS, UP_LAYOUTS
from splatq.shared.settings import parsers as p
from splatq.shared.settings.front import TenantSettings
from splatq.shared.settings.groups import DAY_S, LEASES, STREAMS, WORKERS

DEFAULT_STAGE_TIMEOUT_S: Mapping[str, int] = {
    "ingest": 60, "reconstruct": 600, "export": 300, "render": 600, "publish": 300, "cleanup": 300,
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class StreamSettings(TenantSettings):
    """Streams, partitions and fair scheduling."""

    # Streams and partitions: job ids carry their partition, so changing the count strands
    # nothing, but new jobs spread differently.
    partitions: int = STREAMS(
        "SPLATQ_PARTITIONS",
        1,
        minimum=1,
        doc="stream partitions (Redis Cluster scale-out), within [1, 999]; fixed per deployment",
    )
    worker_partitions: tuple[int, ...] = STREAMS(
        "SPLATQ_WORKER_PARTITIONS",
        (),
        parse=p.parse_int_list,
        shown="all",
        doc="comma-separated partitions this worker consumes",
    )
    fair_scheduling: bool = STREAMS(
        "SPLATQ_FAIR_SCHEDULING",
        True,
        doc="serve tenants with waiting work in weighted deficit round-robin by job cost, in"
        " every stream; 0 = arrival order"
        " ([fair scheduling](docs/architecture.md#fair-scheduling))",
    )
    job_costs: Mapping[str, int] = STREAMS(
        "SPLATQ_JOB_COSTS",
        DEFAULT_COSTS,
        parse=p.int_map("quality"),
        doc="estimated cost per quality",
    )
    tenant_weights: Mapping[str, int] = STREAMS(
        "SPLATQ_TENANT_WEIGHTS",
        {},
        parse=p.int_map("tenant"),
        shown="every tenant 1",
        doc="`tenant=weight,…` shares of a stream",
    )
    # A capped tenant's work lives in its home partition so the cap is one atomic counter.
    tenant_max_running_interactive: int = STREAMS(
        "SPLATQ_TENANT_MAX_RUNNING_INTERACTIVE",
        0,
        shown="0 (no cap)",
        doc="interactive jobs of one tenant fed to workers and unfinished at once, global across"
        " workers (a capped tenant's work lives in its home partition)",
    )
    tenant_max_running_synthesis: int = STREAMS(
        "SPLATQ_TENANT_MAX_RUNNING_SYNTHESIS",
        0,
        shown="0 (no cap)",
        doc="the same for synthesis jobs",
    )
    stream_maxlen: int = STREAMS(
        "SPLATQ_STREAM_MAXLEN", 1_000_000, minimum=1000, doc="`MAXLEN ~` cap of the job streams"
    )
    events_maxlen: int = STREAMS(
        "SPLATQ_EVENTS_MAXLEN", 100_000, minimum=1000, doc="`MAXLEN ~` cap of the event streams"
    )
    dlq_maxlen: int = STREAMS(
        "SPLATQ_DLQ_MAXLEN", 100_000, minimum=1000, doc="`MAXLEN ~` cap of the dead-letter streams"
    )
    dead_letter_codes: frozenset[str] = STREAMS(
        "SPLATQ_DEAD_LETTER_CODES",
        frozenset({"CUDA_OUT_OF_MEMORY", "UPSTREAM_UNAVAILABLE"}),
        parse=p.parse_codes,
        doc="error codes whose failed jobs are also dead-lettered, so a redrive policy can act"
        " on them (a device out of memory; a hosted model's vendor whose circuit stayed open);"
        " `none` = off",
    )
    consumer_group: str = STREAMS("SPLATQ_CONSUMER_GROUP", "workers", doc="consumer group name")


@dataclass(frozen=True, slots=True)
class LeaseSettings(StreamSettings):
    """Leases, deliveries, retries and retention."""

    lease_ttl_ms: int = LEASES(
        "SPLATQ_LEASE_TTL_MS", 15_000, minimum=100, doc="job lease TTL; heartbeat every TTL/3"
    )
    max_deliveries: int = LEASES(
        "SPLATQ_MAX_DELIVERIES",
        5,
        minimum=1,
        doc="worker deaths charged to a job (1/k each when k jobs shared the worker) before it"
        " is dead-lettered; raw deliveries are capped at 3× this",  # noqa: RUF001
    )
    max_attempts: int = LEASES(
        "SPLATQ_MAX_ATTEMPTS", 3, minimum=1, doc="attempts for transient errors before a job fails"
    )
    retry_base_ms: int = LEASES(
        "SPLATQ_RETRY_BASE_MS", 1_000, minimum=1, doc="full-jitter backoff: base"
    )
    retry_cap_ms: int = LEASES("SPLATQ_RETRY_CAP_MS", 300_000, minimum=1, doc="and cap")
    reaper_interval_ms: int = LEASES(
        "SPLATQ_REAPER_INTERVAL_MS",
        5_000,
        minimum=10,
        doc="how often each worker sweeps for abandoned entries",
    )
    idempotency_ttl_s: int = LEASES(
        "SPLATQ_IDEMPOTENCY_TTL_S", 86_400, minimum=1, doc="lifetime of idempotency claims"
    )
    job_retention_s: int = LEASES(
        "SPLATQ_JOB_RETENTION_S",
        7 * DAY_S,
        minimum=60,
        shown="604800 (7 days)",
        doc="how long a job's record (job, events, delivery log, listing entry) is kept after it"
        " finished; `GET /v1/jobs` lists jobs created within it"
        " ([retention](docs/api.md#retention))",
    )
    shutdown_grace_s: float = LEASES(
        "SPLATQ_SHUTDOWN_GRACE_S", 30.0, lo=0, hi=3600, doc="drain time on SIGTERM"
    )
    script_replay_ttl_ms: int = LEASES(
        "SPLATQ_SCRIPT_REPLAY_TTL_MS",
        60_000,
        minimum=1000,
        doc="how long a script's reply is kept for a resend of the same call (a reply lost"
        " after the script ran)",
    )


@dataclass(frozen=True, slots=True)
class WorkerSettings(LeaseSettings):
    """Worker slots, the staged pipeline, per-class processes, memory."""

    worker_concurrency: int = WORKERS(
        "SPLATQ_WORKER_CONCURRENCY", 10, minimum=1, doc="slots per worker process"
    )
    # The staged pipeline (docs/architecture.md#staged-pipeline).
    stages: tuple[str, ...] = WORKERS(
        "SPLATQ_STAGES",
        (),
        parse=p.parse_stages,
        shown="— (whole jobs)",
        doc="the pipeline stages `splatq worker` runs (`--stages`:"
        " `ingest,reconstruct,export,render,publish,cleanup` or `all`; [staged"
        " pipeline](docs/architecture.md#staged-pipeline))",
    )
    stage_handlers: str = WORKERS(
        "SPLATQ_STAGE_HANDLERS",
        "",
        shown="the 3DGS stages",
        doc="the stage handlers factory `package.module:factory`",
    )
    stage_concurrency: Mapping[str, int] = WORKERS(
        "SPLATQ_STAGE_CONCURRENCY",
        {},
        parse=p.stage_map(),
        shown="`SPLATQ_WORKER_CONCURRENCY`",
        doc="per stage (`stage=n,…`): slots",
    )
    stage_max_attempts: Mapping[str, int] = WORKERS(
        "SPLATQ_STAGE_MAX_ATTEMPTS",
        {},
        parse=p.stage_map(),
        shown="`SPLATQ_MAX_ATTEMPTS`",
        doc="per stage (`stage=n,…`): attempts for transient errors",
    )
    stage_timeout_s: Mapping[str, int] = WORKERS(
        "SPLATQ_STAGE_TIMEOUT_S",
        DEFAULT_STAGE_TIMEOUT_S,
        parse=p.stage_map(86_400),
        doc="per stage (`stage=n,…`): seconds per run (a retryable `TIMEOUT` past it)",
    )
    # Backpressure: work waits in the fair queues, in fair order, rather than in a
    # first-come line further down the pipeline. Keep it above a stage's slots.
    stage_buffer: int = WORKERS(
        "SPLATQ_STAGE_BUFFER",
        32,
        doc="backpressure: per class and partition, jobs running in a stage plus waiting for the"
        " next before the stage stops taking work (0 = none); keep it above a stage's slots (a"
        " stage worker with more logs `stage.buffer_below_slots`)",
    )
    # CPU priority of synthesis work (docs/architecture.md#cpu-priority); measured in
    # docs/benchmarks.md#staged-pipeline.
    synthesis_nice: int = WORKERS(
        "SPLATQ_SYNTHESIS_NICE",
        19,
        doc="CPU priority: synthesis jobs' blocking work and forward passes run in threads this"
        " much nicer (0 = off; Linux), a synthesis-only worker process every thread, so a"
        " preview's CPU work goes first ([docs](docs/architecture.md#cpu-priority))",
    )
    synthesis_torch_threads: int = WORKERS(
        "SPLATQ_SYNTHESIS_TORCH_THREADS",
        1,
        doc="torch intra-op threads of one synthesis job's work (0 = torch's default, one per"
        " core; 1 keeps it in its niced thread)",
    )
    # Per-class worker processes (docs/architecture.md#per-class-worker-processes).
    worker_classes: tuple[str, ...] = WORKERS(
        "SPLATQ_WORKER_CLASSES",
        ("interactive", "synthesis"),
        parse=p.parse_classes,
        shown="both",
        doc="the job classes `splatq worker` serves (`--classes interactive|synthesis`; a"
        " synthesis-only process runs niced)",
    )
    up_layout: str = WORKERS(
        "SPLATQ_UP_LAYOUT",
        "auto",
        choices=UP_LAYOUTS,
        shown="`auto`",
        doc="`splatq up`'s worker processes: `auto` (a process per class and pod kind, one GPU"
        " process for both classes with CUDA), `per-class`, `shared` (one per pod kind)"
        " ([docs](docs/architecture.md#per-class-worker-processes))",
    )
    synthesis_idle: bool = WORKERS(
        "SPLATQ_SYNTHESIS_IDLE",
        True,
        doc="a synthesis-only process also runs under SCHED_IDLE (Linux)",
    )
    interactive_share: float = WORKERS(
        "SPLATQ_INTERACTIVE_SHARE",
        0.7,
        lo=0.0,
        hi=1.0,
        doc="share of slots reserved for the interactive stream",
    )
    fetch_block_ms: int = WORKERS(
        "SPLATQ_FETCH_BLOCK_MS", 1_000, minimum=1, doc="longest blocking read while idle"
    )
    # Worker memory (docs/operations.md#memory). glibc keeps memory a thread freed in that
    # thread's malloc arena (up to 8 per core), so each job thread kept the peak of its largest
    # work.
    malloc_arena_max: int = WORKERS(
        "SPLATQ_MALLOC_ARENA_MAX",
        2,
        parse=p.parse_malloc_arena_max,
        doc="worker memory: malloc arenas per worker process (0 = glibc's default;"
        " `MALLOC_ARENA_MAX` wins) ([docs](docs/operations.md#memory))",
    )
    memory_trim: bool = WORKERS(
        "SPLATQ_MEMORY_TRIM",
        True,
        doc="free memory handed back to the OS (malloc_trim) after job pools' blocking calls",
    )
    memory_trim_interval_ms: int = WORKERS(
        "SPLATQ_MEMORY_TRIM_INTERVAL_MS",
        1_000,
        doc="at most this often while those calls overlap",
    )
    job_handler: str = WORKERS(
        "SPLATQ_JOB_HANDLER",
        "",
        shown="GPU worker",
        doc="`package.module:factory` for `splatq worker`",
    )
