"""The settings of the services around the queue: the GPU worker and its model, webhooks,
maintenance, observability. Each declared once (shared/settings/declare.py); `Settings`
inherits them all."""

from __future__ import annotations

from dataclasses import dataclass

from splatq.shared.settings import parsers as p
from splatq.shared.settings.groups import (
    DAY_S,
    MAINTENANCE,
    MODEL,
    OBSERVABILITY,
    WEBHOOKS,
)
from splatq.shared.settings.pipeline import WorkerSettings

# The shortest input/artifact retention the environment may set: a typo of 0 or 60 would
# otherwise delete nearly every stored object at the next run of the retention task.
MIN_FILE_RETENTION_S = 3600


@dataclass(frozen=True, slots=True)
class ModelSettings(WorkerSettings):
    """The GPU worker: device, model, foreground, result cache, batching."""

    device: str = MODEL(
        "SPLATQ_DEVICE",
        "auto",
        choices=frozenset({"auto", "cpu", "cuda"}),
        doc="`auto` (CUDA if available), `cpu`, `cuda`",
    )
    model: str = MODEL(
        "SPLATQ_MODEL",
        "builtin",
        doc="`builtin`, `package.module:factory` (gets the local checkpoint path), or `remote`:"
        " a vendor's hosted model ([docs/hosted-model.md](docs/hosted-model.md))",
    )
    model_checkpoint: str = MODEL(
        "SPLATQ_MODEL_CHECKPOINT", "", doc="the local checkpoint a model factory gets"
    )
    # Foreground (issue #22; services/gpu_worker/foreground.py).
    foreground: str = MODEL(
        "SPLATQ_FOREGROUND",
        "segment",
        choices=frozenset({"segment", "learned", "none"}),
        doc="stage 0 for inputs without a cut-out alpha: `segment` (built-in GrabCut), `learned`"
        " (the ONNX remover below), `none` (the whole frame, as before) ([stage"
        " 0](docs/gpu-worker.md#stage-0-the-object))",
    )
    foreground_model: str = MODEL(
        "SPLATQ_FOREGROUND_MODEL",
        "",
        doc="the learned remover's local ONNX file (required by `learned`: the worker exits 78"
        " without it; never downloaded)",
    )
    foreground_normalisation: str = MODEL(
        "SPLATQ_FOREGROUND_NORMALISATION",
        "imagenet",
        choices=frozenset({"imagenet", "isnet"}),
        doc="the learned remover's input statistics: `imagenet` (U2-Net, BiRefNet) or `isnet`"
        " (mean 0.5, deviation 1: ISNet/DIS exports, e.g. IMG.LY's background-removal-data)",
    )
    foreground_margin: float = MODEL(
        "SPLATQ_FOREGROUND_MARGIN",
        0.1,
        lo=0.0,
        hi=1.0,
        doc="the margin recentring keeps around the object's box, a fraction of its side",
    )
    # Remote model backends and the result cache (docs/hosted-model.md). By default both TTLs
    # are the idempotency claim's 24 h (no stale window: a refresh is a new computation,
    # charged to the tenant).
    remote_config: str = MODEL(
        "SPLATQ_REMOTE_CONFIG",
        "",
        doc="`SPLATQ_MODEL=remote`: the vendor's TOML configuration (API shape, auth from a"
        " variable or a mounted secret, limits held for the whole fleet in Redis, circuit breaker)",
    )
    cache_soft_ttl_s: int = MODEL(
        "SPLATQ_CACHE_SOFT_TTL_S",
        DAY_S,
        doc="result cache: fresh until this, then served `stale: true` with one background refresh",
    )
    cache_hard_ttl_s: int = MODEL(
        "SPLATQ_CACHE_HARD_TTL_S", DAY_S, minimum=1, doc="result cache: a miss after this"
    )
    # Dynamic batching (Triton / Ray Serve semantics).
    batch_max_size: int = MODEL(
        "SPLATQ_BATCH_MAX_SIZE", 8, minimum=1, doc="dynamic batching: jobs in a batch"
    )
    batch_max_wait_ms: int = MODEL(
        "SPLATQ_BATCH_MAX_WAIT_MS", 20, doc="dynamic batching: wait from the batch's oldest job"
    )
    batch_max_pixels: int = MODEL(
        "SPLATQ_BATCH_MAX_PIXELS", 0, doc="dynamic batching: input-pixel bound (0 = none)"
    )
    device_max_pass_ms: int = MODEL(
        "SPLATQ_DEVICE_MAX_PASS_MS",
        250,
        doc="device priority: a synthesis batch takes the device in chunks of about this long,"
        " so a waiting preview batch runs after one chunk (0 = whole batches;"
        " [docs](docs/gpu-worker.md#device-priority))",
    )
    device_memory_budget_pixels: int = MODEL(
        "SPLATQ_DEVICE_MEMORY_BUDGET_PIXELS",
        0,
        shown="0 (off)",
        doc="simulate a smaller device (raises the real CUDA OOM beyond it; tests, capacity"
        " drills)",
    )


@dataclass(frozen=True, slots=True)
class WebhookSettings(ModelSettings):
    """Webhook delivery (the dispatcher)."""

    # Webhooks (the dispatcher; parsed here so configuration lives in one place).
    webhook_allow_private: bool = WEBHOOKS(
        "SPLATQ_WEBHOOK_ALLOW_PRIVATE",
        False,
        doc="`1` lets webhooks reach loopback/private addresses (development)",
    )
    webhook_max_attempts: int = WEBHOOKS(
        "SPLATQ_WEBHOOK_MAX_ATTEMPTS",
        18,
        minimum=1,
        doc="attempts before a message is dead-lettered",
    )
    webhook_retry_base_ms: int = WEBHOOKS(
        "SPLATQ_WEBHOOK_RETRY_BASE_MS", 5_000, minimum=1, doc="full-jitter backoff: base"
    )
    webhook_retry_cap_ms: int = WEBHOOKS(
        "SPLATQ_WEBHOOK_RETRY_CAP_MS", 36_000_000, minimum=1, doc="and cap (~a day in all)"
    )
    webhook_timeout_s: float = WEBHOOKS(
        "SPLATQ_WEBHOOK_TIMEOUT_S", 15.0, lo=0.1, hi=300, doc="total time of one attempt"
    )
    webhook_concurrency: int = WEBHOOKS(
        "SPLATQ_WEBHOOK_CONCURRENCY", 64, minimum=1, doc="attempts in flight per dispatcher"
    )
    webhook_concurrency_per_endpoint: int = WEBHOOKS(
        "SPLATQ_WEBHOOK_CONCURRENCY_PER_ENDPOINT",
        4,
        minimum=1,
        doc="attempts in flight per target (a registered endpoint, or a job `webhook_url`'s host)",
    )
    webhook_concurrency_per_host: int = WEBHOOKS(
        "SPLATQ_WEBHOOK_CONCURRENCY_PER_HOST",
        16,
        minimum=1,
        doc="connections per receiver host (several endpoints may share a host)",
    )
    webhook_tenant_share: float = WEBHOOKS(
        "SPLATQ_WEBHOOK_TENANT_SHARE",
        0.5,
        lo=0.01,
        hi=1.0,
        doc="the most of a dispatcher's slots one tenant with slow receivers may hold",
    )
    webhook_max_endpoints: int = WEBHOOKS(
        "SPLATQ_WEBHOOK_MAX_ENDPOINTS", 50, minimum=1, doc="endpoints per tenant"
    )
    webhook_rotation_overlap_s: int = WEBHOOKS(
        "SPLATQ_WEBHOOK_ROTATION_OVERLAP_S",
        DAY_S,
        doc="how long the previous secret keeps signing after a rotation",
    )
    webhook_recover_limit: int = WEBHOOKS(
        "SPLATQ_WEBHOOK_RECOVER_LIMIT",
        10_000,
        minimum=1,
        doc="messages one `recover` call sends again",
    )
    # Circuit breaker per endpoint (Convoy's rule: 10 consecutive failures, or >= 70 %
    # failures over >= 10 attempts in a window) and auto-disable (Svix: 5 days failing).
    webhook_breaker_consecutive: int = WEBHOOKS(
        "SPLATQ_WEBHOOK_BREAKER_CONSECUTIVE",
        10,
        minimum=1,
        doc="failures in a row that open an endpoint's circuit",
    )
    webhook_breaker_ratio: float = WEBHOOKS(
        "SPLATQ_WEBHOOK_BREAKER_RATIO",
        0.7,
        lo=0.01,
        hi=1.0,
        doc="the failure ratio that opens it, over at least `_MIN_ATTEMPTS` attempts in a"
        " `_WINDOW_MS` window",
    )
    webhook_breaker_min_attempts: int = WEBHOOKS(
        "SPLATQ_WEBHOOK_BREAKER_MIN_ATTEMPTS", 10, minimum=1, doc="the ratio rule's attempts"
    )
    webhook_breaker_window_ms: int = WEBHOOKS(
        "SPLATQ_WEBHOOK_BREAKER_WINDOW_MS", 60_000, minimum=100, doc="the ratio rule's window"
    )
    webhook_breaker_open_ms: int = WEBHOOKS(
        "SPLATQ_WEBHOOK_BREAKER_OPEN_MS",
        30_000,
        minimum=10,
        doc="an open circuit's cool-down, doubling with each consecutive opening",
    )
    webhook_breaker_open_cap_ms: int = WEBHOOKS(
        "SPLATQ_WEBHOOK_BREAKER_OPEN_CAP_MS", 1_800_000, minimum=10, doc="up to this"
    )
    webhook_disable_after_s: int = WEBHOOKS(
        "SPLATQ_WEBHOOK_DISABLE_AFTER_S",
        5 * DAY_S,
        minimum=1,
        doc="continuous failure before an endpoint is disabled",
    )


@dataclass(frozen=True, slots=True)
class MaintenanceSettings(WebhookSettings):
    """The DLQ redriver and scheduled maintenance."""

    # The DLQ redriver and scheduled maintenance (services/dlq_redriver/).
    redriver_config: str = MAINTENANCE(
        "SPLATQ_REDRIVER_CONFIG",
        "",
        shown="— (built-in defaults)",
        doc="the redriver's policies and schedules (TOML,"
        " [format](docs/operations.md#redrive-policies))",
    )
    # The retention task (shared/maintenance/retention.py); keeping files forever is disabling
    # the task (`[tasks.retention] enabled = false`); its config's [retention] table overrides.
    input_retention_s: int = MAINTENANCE(
        "SPLATQ_INPUT_RETENTION_S",
        7 * DAY_S,
        minimum=MIN_FILE_RETENTION_S,
        doc="age (at least 3600) after which the retention task deletes submitted images no job"
        " needs",
    )
    artifact_retention_s: int = MAINTENANCE(
        "SPLATQ_ARTIFACT_RETENTION_S",
        30 * DAY_S,
        minimum=MIN_FILE_RETENTION_S,
        doc="age (at least 3600) after which the retention task deletes artifacts no job needs",
    )
    task_lock_ttl_ms: int = MAINTENANCE(
        "SPLATQ_TASK_LOCK_TTL_MS",
        30_000,
        minimum=100,
        doc="lease of one scheduled task run (a dead replica's run resumes after it)",
    )
    task_poll_ms: int = MAINTENANCE(
        "SPLATQ_TASK_POLL_MS", 1_000, minimum=10, doc="how often replicas look for claimable runs"
    )


@dataclass(frozen=True, slots=True)
class ObservabilitySettings(MaintenanceSettings):
    """Logs, metrics, probes and tracing."""

    log_format: str = OBSERVABILITY(
        "SPLATQ_LOG_FORMAT",
        "auto",
        choices=frozenset({"auto", "json", "console"}),
        doc="`json`, `console`",
    )
    log_level: str = OBSERVABILITY(
        "SPLATQ_LOG_LEVEL",
        "info",
        choices=frozenset({"debug", "info", "warning", "error"}),
        doc="`debug` … `error`",
    )
    metrics_port: int = OBSERVABILITY(
        "SPLATQ_METRICS_PORT",
        0,
        shown="0 (off)",
        doc="`/metrics` and `/livez` of a worker, the dispatcher, the redriver or the settler"
        " ([probes](docs/operations.md#probes)), `/metrics` of the gateway (without it, the"
        " gateway's `/metrics` is on its API port behind the admin key); under `splatq up` a"
        " base: +0/+1/+2/+3/+4/+5 (GPU worker of both classes, dispatcher, redriver, settler,"
        " CPU worker of both classes, gateway), +6/+7 (GPU worker interactive/synthesis),"
        " +8/+9 (CPU worker interactive/synthesis)",
    )
    # Per-tenant metrics (docs/operations.md#metrics).
    metrics_top_tenants: int = OBSERVABILITY(
        "SPLATQ_METRICS_TOP_TENANTS",
        10,
        doc="per-tenant gauges for the top N tenants by waiting jobs (the rest as `other`)",
    )
    metrics_tenants: tuple[str, ...] = OBSERVABILITY(
        "SPLATQ_METRICS_TENANTS",
        (),
        parse=p.parse_names,
        doc="tenants (comma-separated) whose finished jobs get their own counter label",
    )
    liveness_max_age_s: float = OBSERVABILITY(
        "SPLATQ_LIVENESS_MAX_AGE_S",
        15.0,
        lo=1.0,
        hi=3600.0,
        doc="`/livez` answers 503 once the event loop has not beaten for this long",
    )
    tracing: str = OBSERVABILITY(
        "SPLATQ_TRACING",
        "off",
        choices=frozenset({"off", "otlp", "console"}),
        doc="OpenTelemetry spans: `otlp` (the `OTEL_EXPORTER_OTLP_*` variables) or `console`"
        " (spans as JSON on stdout); needs `pip install 'splatq[otel]'`"
        " ([tracing](docs/operations.md#tracing))",
    )
