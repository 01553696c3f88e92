"""One frozen, typed settings object read from the environment once (`Settings.from_env()`).

The only module that reads `os.environ`; everything else receives a `Settings` explicitly.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from splatq.shared.engine.fairness import DEFAULT_COSTS, FairScheduling, parse_int_map
from splatq.shared.engine.stages import parse_stage_list
from splatq.shared.engine.worker_classes import UP_LAYOUTS, parse_class_list

# The shortest input/artifact retention the environment may set: a typo of 0 or 60 would
# otherwise delete nearly every stored object at the next run of the retention task.
MIN_FILE_RETENTION_S = 3600


class SettingsError(ValueError):
    """An environment variable holds a value that cannot be used."""


def _int(env: Mapping[str, str], name: str, default: int, minimum: int = 0) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SettingsError(f"{name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise SettingsError(f"{name} must be >= {minimum}, got {value}")
    return value


def _float(env: Mapping[str, str], name: str, default: float, lo: float, hi: float) -> float:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name} must be a number, got {raw!r}") from None
    if not lo <= value <= hi:
        raise SettingsError(f"{name} must be within [{lo}, {hi}], got {value}")
    return value


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    lowered = raw.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise SettingsError(f"{name} must be a boolean (1/0/true/false), got {raw!r}")


def _choice(env: Mapping[str, str], name: str, default: str, allowed: frozenset[str]) -> str:
    value = env.get(name, "").strip() or default
    if value not in allowed:
        raise SettingsError(f"{name} must be one of {sorted(allowed)}, got {value!r}")
    return value


def _int_map(
    env: Mapping[str, str], name: str, what: str, default: Mapping[str, int]
) -> Mapping[str, int]:
    raw = env.get(name, "").strip()
    if not raw:
        return dict(default)
    try:
        return parse_int_map(raw, what, 1000)
    except ValueError as exc:
        raise SettingsError(f"{name}: {exc}") from None


def _stages(env: Mapping[str, str], name: str) -> tuple[str, ...]:
    raw = env.get(name, "").strip()
    if not raw:
        return ()
    try:
        return tuple(s.value for s in parse_stage_list(raw))
    except ValueError as exc:
        raise SettingsError(f"{name}: {exc}") from None


def _classes(env: Mapping[str, str], name: str) -> tuple[str, ...]:
    try:
        return tuple(c.value for c in parse_class_list(env.get(name, "")))
    except ValueError as exc:
        raise SettingsError(f"{name}: {exc}") from None


def _stage_map(
    env: Mapping[str, str], name: str, default: Mapping[str, int], maximum: int = 1000
) -> Mapping[str, int]:
    """'reconstruct=16,export=4': per-stage integers over the default's; names are checked."""
    raw = env.get(name, "").strip()
    if not raw:
        return dict(default)
    try:
        given = parse_int_map(raw, "stage", maximum)
        parse_stage_list(",".join(given))
    except ValueError as exc:
        raise SettingsError(f"{name}: {exc}") from None
    return {**default, **given}


def _codes(env: Mapping[str, str], name: str, default: frozenset[str]) -> frozenset[str]:
    """A comma-separated set of error codes; unset: the default; `none`: empty."""
    raw = env.get(name)
    if raw is None:
        return default
    codes = frozenset(filter(None, (part.strip() for part in raw.split(","))))
    if codes == {"none"}:
        return frozenset()
    bad = sorted(c for c in codes if not c.replace("_", "").isalnum())
    if bad:
        raise SettingsError(f"{name} must list error codes (letters, digits, _), got {bad[0]!r}")
    return codes


def _api_keys(raw: str) -> Mapping[str, str]:
    """Parse `tenant:key,tenant2:key2` into {key: tenant}."""
    keys: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in raw.split(","))):
        tenant, sep, key = item.partition(":")
        if not sep or not tenant or not key:
            raise SettingsError(f"SPLATQ_API_KEYS entries must be tenant:key, got {item!r}")
        keys[key] = tenant
    return keys


DEFAULT_QUOTA_ESTIMATES_MS: Mapping[str, int] = {"preview": 15_000, "full": 120_000}
# The input's own fault (the worker's decode refused it) and a poison job (crash attribution
# dead-lettered it: it killed its worker every time, alone): charged like a completion.
DEFAULT_CHARGED_FAILURE_CODES = frozenset(
    {"INVALID_IMAGE", "IMAGE_TOO_LARGE", "IMAGE_TOO_COMPLEX", "dead_lettered"}
)


def _quota_estimates(raw: str) -> Mapping[str, int]:
    """Parse `preview:15,full:120` (GPU-seconds per quality) into {quality: ms}."""
    table = dict(DEFAULT_QUOTA_ESTIMATES_MS)
    for item in filter(None, (part.strip() for part in raw.split(","))):
        quality, sep, seconds = item.partition(":")
        try:
            value = float(seconds)
        except ValueError:
            value = -1.0
        if not sep or quality not in table or value < 0:
            raise SettingsError(
                f"SPLATQ_QUOTA_ESTIMATE_S entries must be quality:seconds with quality in"
                f" {sorted(table)}, got {item!r}"
            )
        table[quality] = round(value * 1000)
    return table


@dataclass(frozen=True, slots=True)
class Settings:
    """Every tunable of splatq; defaults work for a local stack."""

    redis_url: str = "redis://127.0.0.1:6379/0"
    # True when SPLATQ_REDIS_URL was not set: `splatq up` then starts its own redis-server.
    redis_url_is_default: bool = True
    storage_url: str = ""
    s3_endpoint_url: str = ""
    public_url: str = ""
    api_keys: Mapping[str, str] = field(default_factory=dict)
    gateway_port: int = 8080
    gateway_host: str = "0.0.0.0"
    max_upload_bytes: int = 20 * 1024 * 1024
    # Phone photos (48-64 MP) fit; a JPEG decodes DCT-scaled (shared/images/headers.py).
    max_image_pixels: int = 80_000_000
    # Pre-decode bounds on an upload (shared/images/headers.py), checked by the gateway and
    # the worker: bytes one decoded image may take at its decode's peak (a 50 MP HEIC decodes
    # whole and peaks at ~6 bytes a pixel: 286 MiB), scans of a progressive JPEG.
    max_decode_bytes: int = 300 * 1024 * 1024
    max_jpeg_scans: int = 32
    # Uploads decoded at once per gateway process, and per tenant within that (past a
    # bounded wait: 429 too_many_decodes for the tenant, 503 overloaded for the process).
    decode_concurrency: int = 4
    decode_concurrency_per_tenant: int = 2
    decode_wait_s: float = 2.0
    # Admission control: per-tenant token bucket, and per-stream-partition backlog limits
    # beyond which submissions are refused (503) instead of queued forever.
    rate_limit_per_s: float = 20.0
    rate_limit_burst: int = 40
    # The same per tenant for GET /v1/jobs (listings), a budget of its own.
    list_rate_limit_per_s: float = 10.0
    list_rate_limit_burst: int = 20
    max_backlog_interactive: int = 10_000
    max_backlog_synthesis: int = 2_000
    # One tenant's share of a stream partition's backlog: past it, that tenant alone gets
    # 429 tenant_backlog_full while the others still submit (1.0 = no per-tenant bound).
    tenant_backlog_share: float = 0.25
    sse_keepalive_s: float = 15.0
    # Slow clients: a request's headers must be complete within header_timeout_s of its first
    # byte (of the connection's start, for the first request), its body within body_timeout_s
    # of the handler starting to read it; past either, 408 request_timeout and the connection
    # is closed. (An idle keep-alive connection is closed after aiohttp's 75 s.)
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    # Input by URL (`image_url`): the whole fetch's time limit (the size limit is
    # max_upload_bytes), and whether loopback/private addresses may be fetched (development
    # and tests only, like SPLATQ_WEBHOOK_ALLOW_PRIVATE).
    image_url_timeout_s: float = 10.0
    # The longest `Prefer: wait=N` on POST /v1/jobs is honoured for (a larger N is clamped).
    prefer_wait_max_s: int = 60
    image_url_allow_private: bool = False
    image_url_fetches_per_tenant: int = 4
    # Concurrent event streams (SSE) per gateway process, in all and per tenant; beyond them
    # 429 too_many_streams. Each stream holds one connection of the SSE pool (its own, sized
    # to the process cap), never one of the pool every other request shares.
    sse_max_streams: int = 512
    sse_max_streams_per_tenant: int = 32
    # The gateway's shared Redis pool (every request but SSE's blocking reads).
    redis_max_connections: int = 256
    # Opt-in durability across a failover (docs/cluster.md): after a job is accepted and
    # after a job's result is committed, WAIT until this many replicas have the write (at
    # most redis_wait_timeout_ms). 0 = off: asynchronous replication, the Redis default.
    redis_wait_replicas: int = 0
    redis_wait_timeout_ms: int = 500
    # Tenants in Redis (shared/tenants/): the admin API's key (empty = admin API off), and how
    # long the gateway reuses a looked-up API key while the key registry's version is
    # unchanged (revokes and rotations take effect at once), in a cache of at most this many
    # keys per process.
    admin_api_key: str = ""
    # Failed admin authentications allowed per minute, per client address and in all (per
    # gateway process); past either, every admin request is answered 429 until it refills.
    admin_auth_failures_per_min: int = 10
    admin_auth_failures_global_per_min: int = 60
    # A listener of its own for the admin API (0 = it shares the public one); when set, the
    # public listener answers 404 for /v1/admin/*. Its host defaults to SPLATQ_GATEWAY_HOST.
    admin_port: int = 0
    admin_host: str = ""
    api_key_cache_s: float = 5.0
    api_key_cache_size: int = 10_000
    # GPU quotas: GPU time reserved per job at submission, by quality (settled to the
    # measured time when it completes); the settler's sweep of reservations whose job ended
    # unseen (interval, and how old a reservation must be before it is looked at); how long
    # a dead settler's unacknowledged events wait before another settler takes them.
    quota_estimates_ms: Mapping[str, int] = field(
        default_factory=lambda: dict(DEFAULT_QUOTA_ESTIMATES_MS)
    )
    quota_sweep_interval_s: float = 60.0
    quota_sweep_grace_s: float = 600.0
    quota_reclaim_idle_ms: int = 30_000
    # Failures the tenant is charged for (its input's fault, or a poison job): every other
    # failure is the platform's, and waived (shared/tenants/charging.py).
    quota_charged_failure_codes: frozenset[str] = DEFAULT_CHARGED_FAILURE_CODES
    # What the `splatq submit|status|cancel` client commands talk to.
    api_url: str = ""
    api_key: str = ""
    data_dir: Path = Path("var")
    # The port of the redis-server `splatq up` embeds (when SPLATQ_REDIS_URL is not set).
    embedded_redis_port: int = 6390

    # Streams and partitions. The partition count is fixed per deployment (like Kafka
    # partitions): job ids carry their partition, so changing it strands nothing, but new
    # jobs spread differently.
    partitions: int = 1
    worker_partitions: tuple[int, ...] = ()
    # Fair scheduling between tenants (docs/architecture.md#fair-scheduling): within each
    # stream, tenants with waiting work are served in weighted deficit round-robin by the
    # estimated cost of their jobs; off = one queue in arrival order.
    fair_scheduling: bool = True
    job_costs: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_COSTS))
    tenant_weights: Mapping[str, int] = field(default_factory=dict)
    # Jobs of one tenant fed to workers and unfinished at once, per stream (0 = no cap). A
    # capped tenant's work lives in its home partition so the cap is one atomic counter.
    tenant_max_running_interactive: int = 0
    tenant_max_running_synthesis: int = 0
    stream_maxlen: int = 1_000_000
    events_maxlen: int = 100_000
    dlq_maxlen: int = 100_000
    # Error codes whose `failed` jobs are also dead-lettered under that code, so a redrive
    # policy can act on them (a device out of memory: redriven later with a smaller batch; a
    # hosted model's vendor whose circuit stayed open: redriven once it is closed).
    dead_letter_codes: frozenset[str] = frozenset({"CUDA_OUT_OF_MEMORY", "UPSTREAM_UNAVAILABLE"})
    consumer_group: str = "workers"

    # Leases, deliveries, retries.
    lease_ttl_ms: int = 15_000
    max_deliveries: int = 5
    max_attempts: int = 3
    retry_base_ms: int = 1_000
    retry_cap_ms: int = 300_000
    reaper_interval_ms: int = 5_000
    idempotency_ttl_s: int = 86_400
    # How long a job's record (its hash, event history, listing entry) is kept: a finished
    # job expires this long after it finished; GET /v1/jobs lists jobs created within it.
    job_retention_s: int = 7 * 24 * 3600
    shutdown_grace_s: float = 30.0
    # How long a script's reply is kept for a resend of the same call (lost replies).
    script_replay_ttl_ms: int = 60_000

    # Worker slot pool.
    worker_concurrency: int = 10
    # The staged pipeline (docs/architecture.md#staged-pipeline). `stages`: what
    # `splatq worker` runs (SPLATQ_STAGES / --stages; empty = whole jobs in one handler).
    # Per stage: slots (else worker_concurrency), attempts (else max_attempts) and a timeout
    # per run in seconds (0 = none). `stage_buffer`: per class and partition, how many jobs
    # may be running in a stage plus waiting (undelivered) for the next one before the stage
    # stops taking work (backpressure: work waits in the fair queues, in fair order, rather
    # than in a first-come line further down the pipeline). Keep it above a stage's slots.
    stages: tuple[str, ...] = ()
    # The stage handlers factory 'package.module:factory' ('' = the 3DGS stages).
    stage_handlers: str = ""
    stage_concurrency: Mapping[str, int] = field(default_factory=dict)
    stage_max_attempts: Mapping[str, int] = field(default_factory=dict)
    stage_timeout_s: Mapping[str, int] = field(
        default_factory=lambda: {
            "ingest": 60, "reconstruct": 600, "export": 300, "render": 600, "publish": 300,
            "cleanup": 300,
        }
    )  # fmt: skip
    stage_buffer: int = 32
    # CPU priority of synthesis work (docs/architecture.md#cpu-priority): a job's blocking work
    # runs in its class's threads, synthesis ones this much nicer (0 = off; Linux only), so a
    # preview's CPU work runs first on cores a flood of full jobs also wants.
    # `synthesis_torch_threads`: torch's intra-op threads of one synthesis job's work (0 =
    # torch's default, one per core); 1 keeps it in its niced thread (full jobs run in
    # parallel across slots instead), while interactive work keeps every core: measured in
    # docs/benchmarks.md#staged-pipeline.
    synthesis_nice: int = 19
    synthesis_torch_threads: int = 1
    # Per-class worker processes (docs/architecture.md#per-class-worker-processes).
    # `worker_classes`: the job classes a worker process serves (SPLATQ_WORKER_CLASSES /
    # --classes: interactive, synthesis, or both = one process sharing its slots, cores and
    # GIL between them); a synthesis-only process runs wholly at `synthesis_nice`.
    # `up_layout`: how `splatq up` lays out its workers: `auto` (a process per class and pod
    # kind; one GPU process for both classes when a CUDA device is there, its device
    # scheduler ordering them), `per-class` (always a process per class), `shared` (one
    # process per pod kind serving both classes, the layout before per-class processes).
    # `synthesis_idle`: a synthesis-only process also runs under SCHED_IDLE (Linux).
    worker_classes: tuple[str, ...] = ("interactive", "synthesis")
    up_layout: str = "auto"
    synthesis_idle: bool = True
    interactive_share: float = 0.7
    fetch_block_ms: int = 1_000
    # Worker memory (docs/operations.md#memory). glibc keeps memory a thread freed in that
    # thread's malloc arena (up to 8 per core), so each job thread kept the peak of its largest
    # work. `malloc_arena_max`: arenas a worker process may use (0 = glibc's default; a
    # MALLOC_ARENA_MAX in the environment wins). `memory_trim`: free memory goes back to the
    # OS (malloc_trim) when a job's blocking call returns and none is in flight, and at most
    # once per `memory_trim_interval_ms` while they overlap.
    malloc_arena_max: int = 2
    memory_trim: bool = True
    memory_trim_interval_ms: int = 1_000

    # Webhooks (used by the dispatcher issue; parsed here so configuration lives in one place).
    webhook_allow_private: bool = False
    webhook_max_attempts: int = 18
    webhook_retry_base_ms: int = 5_000
    webhook_retry_cap_ms: int = 36_000_000
    webhook_timeout_s: float = 15.0
    webhook_concurrency: int = 64
    # In-flight attempts per target (a registered endpoint, or a job webhook_url's host) and,
    # as a coarser net, connections per receiver host (several endpoints may share a host).
    webhook_concurrency_per_endpoint: int = 4
    webhook_concurrency_per_host: int = 16
    # The most of a dispatcher's delivery slots one tenant may hold (the rest stay free for
    # other tenants); while several tenants have attempts in flight, each gets an even share.
    webhook_tenant_share: float = 0.5
    # Webhook endpoints: per-tenant limit, secret rotation overlap, recover bound.
    webhook_max_endpoints: int = 50
    webhook_rotation_overlap_s: int = 24 * 3600
    webhook_recover_limit: int = 10_000
    # Circuit breaker per endpoint (Convoy's rule: 10 consecutive failures, or >= 70 %
    # failures over >= 10 attempts in a window) and auto-disable (Svix: 5 days failing).
    webhook_breaker_consecutive: int = 10
    webhook_breaker_ratio: float = 0.7
    webhook_breaker_min_attempts: int = 10
    webhook_breaker_window_ms: int = 60_000
    webhook_breaker_open_ms: int = 30_000
    webhook_breaker_open_cap_ms: int = 1_800_000
    webhook_disable_after_s: int = 5 * 24 * 3600

    device: str = "auto"
    model: str = "builtin"
    model_checkpoint: str = ""
    # Foreground (issue #22; services/gpu_worker/foreground.py): how stage 0 separates the
    # object from its backdrop when the input has no cut-out alpha -- `segment` (the
    # built-in GrabCut), `learned` (the ONNX remover at foreground_model, a local file; the
    # worker refuses to start without it), `none` (the model gets the whole frame) -- and
    # the margin around the object's box that recentring keeps (a fraction of its side).
    # `foreground_normalisation`: the learned model's input statistics -- `imagenet`
    # (U2-Net, BiRefNet) or `isnet` (mean 0.5, deviation 1: ISNet/DIS exports such as
    # IMG.LY's background-removal-data and BRIA's RMBG-1.4).
    foreground: str = "segment"
    foreground_model: str = ""
    foreground_normalisation: str = "imagenet"
    foreground_margin: float = 0.1

    # Remote model backends and the result cache (docs/hosted-model.md). `remote_config`: the
    # vendor's TOML file for SPLATQ_MODEL=remote (its limits, held fleet-wide in Redis, are
    # in it). The cache: an identical request within `cache_soft_ttl_s` of its result is a
    # hit; until `cache_hard_ttl_s` it is answered at once with `stale: true` and refreshed
    # once in the background; after it, a miss. By default both are the idempotency claim's
    # 24 h (no stale window: a refresh is a new computation, charged to the tenant).
    remote_config: str = ""
    cache_soft_ttl_s: int = 24 * 3600
    cache_hard_ttl_s: int = 24 * 3600

    job_handler: str = ""
    # Dynamic batching (Triton / Ray Serve semantics): a batch leaves when it holds
    # `batch_max_size` jobs, or `batch_max_wait_ms` after its first job arrived, or when the
    # next job would push it over `batch_max_pixels` input pixels (0 = no pixel bound).
    batch_max_size: int = 8
    batch_max_wait_ms: int = 20
    batch_max_pixels: int = 0
    # Device priority: a synthesis batch takes the device in chunks of about this long (by the
    # measured per-item time), so a waiting interactive batch runs after one chunk; 0 = whole
    # batches (docs/gpu-worker.md#device-priority).
    device_max_pass_ms: int = 250
    # Simulates a device with room for this many foreground input pixels per forward pass
    # (raises the real torch.cuda.OutOfMemoryError beyond it); 0 = off. Tests, capacity drills.
    device_memory_budget_pixels: int = 0

    # The DLQ redriver and scheduled maintenance (services/dlq_redriver/): its policies and
    # schedules file (TOML; empty = the built-in defaults), how long a task run's lock lives
    # without a renewal (a crashed holder's run is resumed after it), how often idle
    # replicas look for claimable runs.
    redriver_config: str = ""
    # The redriver's retention task (shared/maintenance/retention.py) deletes stored inputs
    # and artifacts older than these (at least an hour: keeping them forever is disabling
    # the task, `[tasks.retention] enabled = false`); its config file's [retention] table,
    # per tenant too, overrides them.
    input_retention_s: int = 7 * 24 * 3600
    artifact_retention_s: int = 30 * 24 * 3600
    task_lock_ttl_ms: int = 30_000
    task_poll_ms: int = 1_000

    log_format: str = "auto"
    log_level: str = "info"
    metrics_port: int = 0
    # Per-tenant metrics (docs/operations.md#metrics): gauges for the N tenants with the most
    # waiting jobs (the rest as 'other'); finished-job counters only for the named tenants.
    metrics_top_tenants: int = 10
    metrics_tenants: tuple[str, ...] = ()
    # `/livez` on the metrics port answers 503 once the event loop has not beaten for this long.
    liveness_max_age_s: float = 15.0
    # OpenTelemetry traces (the `otel` extra): off, otlp (OTEL_EXPORTER_OTLP_* configure the
    # exporter) or console (spans as JSON on stdout, for a look on a laptop).
    tracing: str = "off"

    def __post_init__(self) -> None:
        if self.partitions < 1 or self.partitions > 999:
            raise SettingsError("SPLATQ_PARTITIONS must be within [1, 999]")
        for p in self.worker_partitions:
            if not 0 <= p < self.partitions:
                raise SettingsError(
                    f"SPLATQ_WORKER_PARTITIONS lists {p}, outside [0, {self.partitions})"
                )
        if self.lease_ttl_ms < 100:
            raise SettingsError("SPLATQ_LEASE_TTL_MS must be >= 100")
        if self.cache_soft_ttl_s > self.cache_hard_ttl_s:
            raise SettingsError("SPLATQ_CACHE_SOFT_TTL_S must be <= SPLATQ_CACHE_HARD_TTL_S")
        if self.admin_api_key:
            check_admin_key(self.admin_api_key)
        if self.admin_port and self.admin_port in (self.gateway_port, self.metrics_port):
            raise SettingsError(
                "SPLATQ_ADMIN_PORT must differ from SPLATQ_GATEWAY_PORT and SPLATQ_METRICS_PORT"
            )
        if self.metrics_port and self.metrics_port == self.gateway_port:
            raise SettingsError("SPLATQ_METRICS_PORT must differ from SPLATQ_GATEWAY_PORT")

    def tenant_backlog_limit(self, stream_limit: int) -> int:
        """A tenant's bound within a stream partition bounded by `stream_limit` (0 = none)."""
        if stream_limit <= 0 or self.tenant_backlog_share >= 1.0:
            return 0
        return max(1, math.ceil(stream_limit * self.tenant_backlog_share))

    @property
    def job_retention_ms(self) -> int:
        return self.job_retention_s * 1000

    @property
    def max_deliveries_hard_cap(self) -> int:
        """Deliveries after which a job is dead-lettered whatever its crash charge (a death
        beside k other jobs charges only 1/k against SPLATQ_MAX_DELIVERIES)."""
        return self.max_deliveries * 3

    @property
    def fleet_allowance_ms(self) -> int:
        """A gap in every worker's contact with Redis longer than this is an outage (its time
        is not charged to leases). Workers tick at a third of it."""
        return self.lease_ttl_ms // 2

    @property
    def fleet_tick_interval_s(self) -> float:
        return self.fleet_allowance_ms / 3000.0

    @property
    def heartbeat_interval_s(self) -> float:
        """Leases are renewed every TTL/3, so two renewals can fail before the lease lapses."""
        return self.lease_ttl_ms / 3000.0

    @property
    def storage_root(self) -> Path:
        """Where local storage lives when SPLATQ_STORAGE_URL is not set."""
        return self.data_dir / "artifacts"

    @property
    def public_base_url(self) -> str:
        """Base of artifact links: SPLATQ_PUBLIC_URL, else the gateway's own address."""
        return self.public_url or f"http://127.0.0.1:{self.gateway_port}"

    @property
    def fairness(self) -> FairScheduling:
        return FairScheduling(
            enabled=self.fair_scheduling,
            costs=self.job_costs,
            weights=self.tenant_weights,
            max_running_interactive=self.tenant_max_running_interactive,
            max_running_synthesis=self.tenant_max_running_synthesis,
        )

    def for_stage(self, stage: str) -> Settings:
        """The settings a stage's worker runs under: its own slots and attempts."""
        return replace(
            self,
            worker_concurrency=self.stage_concurrency.get(stage, self.worker_concurrency),
            max_attempts=self.stage_max_attempts.get(stage, self.max_attempts),
        )

    @property
    def owned_partitions(self) -> tuple[int, ...]:
        """Partitions this process consumes: the configured subset, or all of them."""
        return self.worker_partitions or tuple(range(self.partitions))

    def __repr__(self) -> str:
        """Every field, secrets redacted: settings reach logs, tracebacks and debuggers."""
        shown = ", ".join(
            f"{f.name}={_redacted(f.name, getattr(self, f.name))!r}" for f in fields(self)
        )
        return f"Settings({shown})"

    def with_overrides(self, **changes: Any) -> Settings:
        """A copy with some fields changed (tests and the CLI use this; env stays untouched)."""
        return replace(self, **changes)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read every SPLATQ_* variable once; unknown values raise `SettingsError`."""
        e: Mapping[str, str] = os.environ if env is None else env
        d = cls()
        raw_parts = e.get("SPLATQ_WORKER_PARTITIONS", "").strip()
        try:
            worker_parts = tuple(int(p) for p in raw_parts.split(",") if p.strip())
        except ValueError:
            raise SettingsError(
                f"SPLATQ_WORKER_PARTITIONS must be comma-separated integers, got {raw_parts!r}"
            ) from None
        redis_url = e.get("SPLATQ_REDIS_URL", "").strip()
        return cls(
            redis_url=redis_url or d.redis_url,
            redis_url_is_default=not redis_url,
            storage_url=e.get("SPLATQ_STORAGE_URL", "").strip(),
            s3_endpoint_url=e.get("SPLATQ_S3_ENDPOINT_URL", "").strip(),
            public_url=e.get("SPLATQ_PUBLIC_URL", "").strip().rstrip("/"),
            api_keys=_api_keys(e.get("SPLATQ_API_KEYS", "")),
            gateway_port=_int(e, "SPLATQ_GATEWAY_PORT", d.gateway_port, 0),
            gateway_host=e.get("SPLATQ_GATEWAY_HOST", "").strip() or d.gateway_host,
            max_upload_bytes=_int(e, "SPLATQ_MAX_UPLOAD_BYTES", d.max_upload_bytes, 1024),
            image_url_timeout_s=_float(
                e, "SPLATQ_IMAGE_URL_TIMEOUT_S", d.image_url_timeout_s, 0.1, 300.0
            ),
            prefer_wait_max_s=_int(e, "SPLATQ_PREFER_WAIT_MAX_S", d.prefer_wait_max_s, 0),
            image_url_fetches_per_tenant=_int(
                e, "SPLATQ_IMAGE_URL_FETCHES_PER_TENANT", d.image_url_fetches_per_tenant, 1
            ),
            image_url_allow_private=_bool(
                e, "SPLATQ_IMAGE_URL_ALLOW_PRIVATE", d.image_url_allow_private
            ),
            max_image_pixels=_int(e, "SPLATQ_MAX_IMAGE_PIXELS", d.max_image_pixels, 1),
            max_decode_bytes=_int(e, "SPLATQ_MAX_DECODE_BYTES", d.max_decode_bytes, 1024),
            max_jpeg_scans=_int(e, "SPLATQ_MAX_JPEG_SCANS", d.max_jpeg_scans, 1),
            decode_concurrency=_int(e, "SPLATQ_DECODE_CONCURRENCY", d.decode_concurrency, 1),
            decode_concurrency_per_tenant=_int(
                e, "SPLATQ_DECODE_CONCURRENCY_PER_TENANT", d.decode_concurrency_per_tenant, 1
            ),
            decode_wait_s=_float(e, "SPLATQ_DECODE_WAIT_S", d.decode_wait_s, 0.0, 60.0),
            rate_limit_per_s=_float(e, "SPLATQ_RATE_LIMIT_PER_S", d.rate_limit_per_s, 0.001, 1e6),
            rate_limit_burst=_int(e, "SPLATQ_RATE_LIMIT_BURST", d.rate_limit_burst, 1),
            list_rate_limit_per_s=_float(
                e, "SPLATQ_LIST_RATE_LIMIT_PER_S", d.list_rate_limit_per_s, 0.001, 1e6
            ),
            list_rate_limit_burst=_int(
                e, "SPLATQ_LIST_RATE_LIMIT_BURST", d.list_rate_limit_burst, 1
            ),
            max_backlog_interactive=_int(
                e, "SPLATQ_MAX_BACKLOG_INTERACTIVE", d.max_backlog_interactive, 0
            ),
            tenant_backlog_share=_float(
                e, "SPLATQ_TENANT_BACKLOG_SHARE", d.tenant_backlog_share, 0.001, 1.0
            ),
            max_backlog_synthesis=_int(
                e, "SPLATQ_MAX_BACKLOG_SYNTHESIS", d.max_backlog_synthesis, 0
            ),
            admin_api_key=e.get("SPLATQ_ADMIN_API_KEY", "").strip(),
            admin_auth_failures_per_min=_int(
                e, "SPLATQ_ADMIN_AUTH_FAILURES_PER_MIN", d.admin_auth_failures_per_min, 1
            ),
            admin_auth_failures_global_per_min=_int(
                e,
                "SPLATQ_ADMIN_AUTH_FAILURES_GLOBAL_PER_MIN",
                d.admin_auth_failures_global_per_min,
                1,
            ),
            admin_port=_int(e, "SPLATQ_ADMIN_PORT", d.admin_port, 0),
            admin_host=e.get("SPLATQ_ADMIN_HOST", "").strip(),
            api_key_cache_s=_float(e, "SPLATQ_API_KEY_CACHE_S", d.api_key_cache_s, 0.0, 300.0),
            api_key_cache_size=_int(e, "SPLATQ_API_KEY_CACHE_SIZE", d.api_key_cache_size, 1),
            quota_estimates_ms=_quota_estimates(e.get("SPLATQ_QUOTA_ESTIMATE_S", "")),
            quota_sweep_interval_s=_float(
                e, "SPLATQ_QUOTA_SWEEP_INTERVAL_S", d.quota_sweep_interval_s, 0.01, 86400.0
            ),
            quota_sweep_grace_s=_float(
                e, "SPLATQ_QUOTA_SWEEP_GRACE_S", d.quota_sweep_grace_s, 0.0, 30 * 86400.0
            ),
            quota_charged_failure_codes=_codes(
                e, "SPLATQ_QUOTA_CHARGED_FAILURE_CODES", d.quota_charged_failure_codes
            ),
            quota_reclaim_idle_ms=_int(
                e, "SPLATQ_QUOTA_RECLAIM_IDLE_MS", d.quota_reclaim_idle_ms, 10
            ),
            api_url=e.get("SPLATQ_API_URL", "").strip().rstrip("/"),
            api_key=e.get("SPLATQ_API_KEY", "").strip(),
            sse_keepalive_s=_float(e, "SPLATQ_SSE_KEEPALIVE_S", d.sse_keepalive_s, 0.05, 300),
            header_timeout_s=_float(e, "SPLATQ_HEADER_TIMEOUT_S", d.header_timeout_s, 0.1, 600.0),
            body_timeout_s=_float(e, "SPLATQ_BODY_TIMEOUT_S", d.body_timeout_s, 0.1, 3600.0),
            sse_max_streams=_int(e, "SPLATQ_SSE_MAX_STREAMS", d.sse_max_streams, 1),
            sse_max_streams_per_tenant=_int(
                e, "SPLATQ_SSE_MAX_STREAMS_PER_TENANT", d.sse_max_streams_per_tenant, 1
            ),
            redis_max_connections=_int(
                e, "SPLATQ_REDIS_MAX_CONNECTIONS", d.redis_max_connections, 1
            ),
            redis_wait_replicas=_int(e, "SPLATQ_REDIS_WAIT_REPLICAS", d.redis_wait_replicas, 0),
            redis_wait_timeout_ms=_int(
                e, "SPLATQ_REDIS_WAIT_TIMEOUT_MS", d.redis_wait_timeout_ms, 1
            ),
            data_dir=Path(e.get("SPLATQ_DATA_DIR", "").strip() or d.data_dir),
            embedded_redis_port=_int(e, "SPLATQ_EMBEDDED_REDIS_PORT", d.embedded_redis_port, 1),
            partitions=_int(e, "SPLATQ_PARTITIONS", d.partitions, 1),
            worker_partitions=worker_parts,
            fair_scheduling=_bool(e, "SPLATQ_FAIR_SCHEDULING", d.fair_scheduling),
            job_costs=_int_map(e, "SPLATQ_JOB_COSTS", "quality", d.job_costs),
            tenant_weights=_int_map(e, "SPLATQ_TENANT_WEIGHTS", "tenant", d.tenant_weights),
            tenant_max_running_interactive=_int(
                e, "SPLATQ_TENANT_MAX_RUNNING_INTERACTIVE", d.tenant_max_running_interactive, 0
            ),
            tenant_max_running_synthesis=_int(
                e, "SPLATQ_TENANT_MAX_RUNNING_SYNTHESIS", d.tenant_max_running_synthesis, 0
            ),
            stream_maxlen=_int(e, "SPLATQ_STREAM_MAXLEN", d.stream_maxlen, 1000),
            events_maxlen=_int(e, "SPLATQ_EVENTS_MAXLEN", d.events_maxlen, 1000),
            dlq_maxlen=_int(e, "SPLATQ_DLQ_MAXLEN", d.dlq_maxlen, 1000),
            dead_letter_codes=_codes(e, "SPLATQ_DEAD_LETTER_CODES", d.dead_letter_codes),
            consumer_group=e.get("SPLATQ_CONSUMER_GROUP", "").strip() or d.consumer_group,
            lease_ttl_ms=_int(e, "SPLATQ_LEASE_TTL_MS", d.lease_ttl_ms, 100),
            script_replay_ttl_ms=_int(
                e, "SPLATQ_SCRIPT_REPLAY_TTL_MS", d.script_replay_ttl_ms, 1000
            ),
            max_deliveries=_int(e, "SPLATQ_MAX_DELIVERIES", d.max_deliveries, 1),
            max_attempts=_int(e, "SPLATQ_MAX_ATTEMPTS", d.max_attempts, 1),
            retry_base_ms=_int(e, "SPLATQ_RETRY_BASE_MS", d.retry_base_ms, 1),
            retry_cap_ms=_int(e, "SPLATQ_RETRY_CAP_MS", d.retry_cap_ms, 1),
            reaper_interval_ms=_int(e, "SPLATQ_REAPER_INTERVAL_MS", d.reaper_interval_ms, 10),
            idempotency_ttl_s=_int(e, "SPLATQ_IDEMPOTENCY_TTL_S", d.idempotency_ttl_s, 1),
            job_retention_s=_int(e, "SPLATQ_JOB_RETENTION_S", d.job_retention_s, 60),
            shutdown_grace_s=_float(e, "SPLATQ_SHUTDOWN_GRACE_S", d.shutdown_grace_s, 0, 3600),
            worker_concurrency=_int(e, "SPLATQ_WORKER_CONCURRENCY", d.worker_concurrency, 1),
            interactive_share=_float(e, "SPLATQ_INTERACTIVE_SHARE", d.interactive_share, 0.0, 1.0),
            fetch_block_ms=_int(e, "SPLATQ_FETCH_BLOCK_MS", d.fetch_block_ms, 1),
            # glibc reads its own MALLOC_ARENA_MAX at start: an operator's value stands
            malloc_arena_max=0
            if e.get("MALLOC_ARENA_MAX", "").strip()
            else _int(e, "SPLATQ_MALLOC_ARENA_MAX", d.malloc_arena_max, 0),
            memory_trim=_bool(e, "SPLATQ_MEMORY_TRIM", d.memory_trim),
            memory_trim_interval_ms=_int(
                e, "SPLATQ_MEMORY_TRIM_INTERVAL_MS", d.memory_trim_interval_ms, 0
            ),
            webhook_allow_private=_bool(e, "SPLATQ_WEBHOOK_ALLOW_PRIVATE", False),
            webhook_max_attempts=_int(e, "SPLATQ_WEBHOOK_MAX_ATTEMPTS", d.webhook_max_attempts, 1),
            webhook_retry_base_ms=_int(
                e, "SPLATQ_WEBHOOK_RETRY_BASE_MS", d.webhook_retry_base_ms, 1
            ),
            webhook_retry_cap_ms=_int(e, "SPLATQ_WEBHOOK_RETRY_CAP_MS", d.webhook_retry_cap_ms, 1),
            webhook_timeout_s=_float(e, "SPLATQ_WEBHOOK_TIMEOUT_S", d.webhook_timeout_s, 0.1, 300),
            webhook_concurrency=_int(e, "SPLATQ_WEBHOOK_CONCURRENCY", d.webhook_concurrency, 1),
            webhook_concurrency_per_endpoint=_int(
                e, "SPLATQ_WEBHOOK_CONCURRENCY_PER_ENDPOINT", d.webhook_concurrency_per_endpoint, 1
            ),
            webhook_concurrency_per_host=_int(
                e, "SPLATQ_WEBHOOK_CONCURRENCY_PER_HOST", d.webhook_concurrency_per_host, 1
            ),
            webhook_tenant_share=_float(
                e, "SPLATQ_WEBHOOK_TENANT_SHARE", d.webhook_tenant_share, 0.01, 1.0
            ),
            webhook_max_endpoints=_int(
                e, "SPLATQ_WEBHOOK_MAX_ENDPOINTS", d.webhook_max_endpoints, 1
            ),
            webhook_rotation_overlap_s=_int(
                e, "SPLATQ_WEBHOOK_ROTATION_OVERLAP_S", d.webhook_rotation_overlap_s, 0
            ),
            webhook_recover_limit=_int(
                e, "SPLATQ_WEBHOOK_RECOVER_LIMIT", d.webhook_recover_limit, 1
            ),
            webhook_breaker_consecutive=_int(
                e, "SPLATQ_WEBHOOK_BREAKER_CONSECUTIVE", d.webhook_breaker_consecutive, 1
            ),
            webhook_breaker_ratio=_float(
                e, "SPLATQ_WEBHOOK_BREAKER_RATIO", d.webhook_breaker_ratio, 0.01, 1.0
            ),
            webhook_breaker_min_attempts=_int(
                e, "SPLATQ_WEBHOOK_BREAKER_MIN_ATTEMPTS", d.webhook_breaker_min_attempts, 1
            ),
            webhook_breaker_window_ms=_int(
                e, "SPLATQ_WEBHOOK_BREAKER_WINDOW_MS", d.webhook_breaker_window_ms, 100
            ),
            webhook_breaker_open_ms=_int(
                e, "SPLATQ_WEBHOOK_BREAKER_OPEN_MS", d.webhook_breaker_open_ms, 10
            ),
            webhook_breaker_open_cap_ms=_int(
                e, "SPLATQ_WEBHOOK_BREAKER_OPEN_CAP_MS", d.webhook_breaker_open_cap_ms, 10
            ),
            webhook_disable_after_s=_int(
                e, "SPLATQ_WEBHOOK_DISABLE_AFTER_S", d.webhook_disable_after_s, 1
            ),
            device=_choice(e, "SPLATQ_DEVICE", d.device, frozenset({"auto", "cpu", "cuda"})),
            model=e.get("SPLATQ_MODEL", "").strip() or d.model,
            model_checkpoint=e.get("SPLATQ_MODEL_CHECKPOINT", "").strip(),
            foreground=_choice(
                e, "SPLATQ_FOREGROUND", d.foreground, frozenset({"segment", "learned", "none"})
            ),
            foreground_model=e.get("SPLATQ_FOREGROUND_MODEL", "").strip(),
            foreground_normalisation=_choice(
                e,
                "SPLATQ_FOREGROUND_NORMALISATION",
                d.foreground_normalisation,
                frozenset({"imagenet", "isnet"}),
            ),
            foreground_margin=_float(e, "SPLATQ_FOREGROUND_MARGIN", d.foreground_margin, 0.0, 1.0),
            remote_config=e.get("SPLATQ_REMOTE_CONFIG", "").strip(),
            cache_soft_ttl_s=_int(e, "SPLATQ_CACHE_SOFT_TTL_S", d.cache_soft_ttl_s, 0),
            cache_hard_ttl_s=_int(e, "SPLATQ_CACHE_HARD_TTL_S", d.cache_hard_ttl_s, 1),
            batch_max_size=_int(e, "SPLATQ_BATCH_MAX_SIZE", d.batch_max_size, 1),
            batch_max_wait_ms=_int(e, "SPLATQ_BATCH_MAX_WAIT_MS", d.batch_max_wait_ms, 0),
            batch_max_pixels=_int(e, "SPLATQ_BATCH_MAX_PIXELS", d.batch_max_pixels, 0),
            device_max_pass_ms=_int(e, "SPLATQ_DEVICE_MAX_PASS_MS", d.device_max_pass_ms, 0),
            stages=_stages(e, "SPLATQ_STAGES"),
            stage_handlers=e.get("SPLATQ_STAGE_HANDLERS", "").strip(),
            stage_concurrency=_stage_map(e, "SPLATQ_STAGE_CONCURRENCY", d.stage_concurrency),
            stage_max_attempts=_stage_map(e, "SPLATQ_STAGE_MAX_ATTEMPTS", d.stage_max_attempts),
            stage_timeout_s=_stage_map(e, "SPLATQ_STAGE_TIMEOUT_S", d.stage_timeout_s, 86_400),
            stage_buffer=_int(e, "SPLATQ_STAGE_BUFFER", d.stage_buffer, 0),
            synthesis_nice=_int(e, "SPLATQ_SYNTHESIS_NICE", d.synthesis_nice, 0),
            synthesis_torch_threads=_int(
                e, "SPLATQ_SYNTHESIS_TORCH_THREADS", d.synthesis_torch_threads, 0
            ),
            worker_classes=_classes(e, "SPLATQ_WORKER_CLASSES"),
            up_layout=_choice(e, "SPLATQ_UP_LAYOUT", d.up_layout, UP_LAYOUTS),
            synthesis_idle=_bool(e, "SPLATQ_SYNTHESIS_IDLE", d.synthesis_idle),
            device_memory_budget_pixels=_int(
                e, "SPLATQ_DEVICE_MEMORY_BUDGET_PIXELS", d.device_memory_budget_pixels, 0
            ),
            job_handler=e.get("SPLATQ_JOB_HANDLER", "").strip(),
            log_format=_choice(
                e, "SPLATQ_LOG_FORMAT", d.log_format, frozenset({"auto", "json", "console"})
            ),
            log_level=_choice(
                e,
                "SPLATQ_LOG_LEVEL",
                d.log_level,
                frozenset({"debug", "info", "warning", "error"}),
            ),
            metrics_port=_int(e, "SPLATQ_METRICS_PORT", d.metrics_port, 0),
            metrics_top_tenants=_int(e, "SPLATQ_METRICS_TOP_TENANTS", d.metrics_top_tenants, 0),
            metrics_tenants=tuple(
                t.strip() for t in e.get("SPLATQ_METRICS_TENANTS", "").split(",") if t.strip()
            ),
            liveness_max_age_s=_float(
                e, "SPLATQ_LIVENESS_MAX_AGE_S", d.liveness_max_age_s, 1.0, 3600.0
            ),
            tracing=_choice(e, "SPLATQ_TRACING", d.tracing, frozenset({"off", "otlp", "console"})),
            redriver_config=e.get("SPLATQ_REDRIVER_CONFIG", "").strip(),
            input_retention_s=_int(
                e, "SPLATQ_INPUT_RETENTION_S", d.input_retention_s, MIN_FILE_RETENTION_S
            ),
            artifact_retention_s=_int(
                e, "SPLATQ_ARTIFACT_RETENTION_S", d.artifact_retention_s, MIN_FILE_RETENTION_S
            ),
            task_lock_ttl_ms=_int(e, "SPLATQ_TASK_LOCK_TTL_MS", d.task_lock_ttl_ms, 100),
            task_poll_ms=_int(e, "SPLATQ_TASK_POLL_MS", d.task_poll_ms, 10),
        )


# The admin API's key: long and varied enough that guessing it is hopeless even unthrottled.
MIN_ADMIN_KEY_CHARS = 32
MIN_ADMIN_KEY_DISTINCT = 10


def check_admin_key(key: str) -> None:
    """SettingsError unless `key` is a strong admin key (never echoed in the message)."""
    if (
        len(key) < MIN_ADMIN_KEY_CHARS
        or len(set(key)) < MIN_ADMIN_KEY_DISTINCT
        or not (key.isascii() and key.isprintable())
        or " " in key
    ):
        raise SettingsError(
            f"SPLATQ_ADMIN_API_KEY is too weak: it must be at least {MIN_ADMIN_KEY_CHARS}"
            f" visible ASCII characters, at least {MIN_ADMIN_KEY_DISTINCT} of them different"
            " (generate one: python -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )


_SECRET_NAME_PARTS = ("key", "secret", "password", "token")
REDACTED = "<redacted>"


def _redacted(name: str, value: Any) -> Any:
    """A field's value as `Settings.__repr__` shows it."""
    if name == "api_keys":
        # {key: tenant}: the tenants are no secret, the keys are.
        return f"{REDACTED} ({len(value)} keys of {sorted(set(value.values()))})"
    if isinstance(value, str) and value and any(p in name for p in _SECRET_NAME_PARTS):
        return REDACTED
    if isinstance(value, str) and "://" in value:
        return redact_url(value)
    return value


def redact_url(url: str) -> str:
    """`url` without its credentials: the user-info part (`user:password@`) and the values of
    query parameters that name a secret (`?password=…`) become `<redacted>`."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return REDACTED  # unparsable: it could hide a credential anywhere
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{REDACTED}@{netloc.rpartition('@')[2]}"
    params = []
    for item in parts.query.split("&") if parts.query else []:
        name, eq, _ = item.partition("=")
        secret = eq and any(p in name.lower() for p in _SECRET_NAME_PARTS)
        params.append(f"{name}={REDACTED}" if secret else item)
    return urlunsplit(parts._replace(netloc=netloc, query="&".join(params)))


def process_environment(**overrides: str) -> dict[str, str]:
    """This process's environment plus `overrides`: what child services inherit."""
    env = dict(os.environ)
    env.update(overrides)
    return env
