"""The settings of the front: Redis, storage and the local stack; the gateway; tenants, keys
and quotas. Declared once each (shared/settings/declare.py); `Settings` inherits them all."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from splatq.shared.settings import parsers as p
from splatq.shared.settings.groups import GATEWAY, STACK, TENANTS

DEFAULT_QUOTA_ESTIMATES_MS: Mapping[str, int] = {"preview": 15_000, "full": 120_000}
# The input's own fault (the worker's decode refused it) and a poison job (crash attribution
# dead-lettered it: it killed its worker every time, alone): charged like a completion.
DEFAULT_CHARGED_FAILURE_CODES = frozenset(
    {"INVALID_IMAGE", "IMAGE_TOO_LARGE", "IMAGE_TOO_COMPLEX", "dead_lettered"}
)


@dataclass(frozen=True, slots=True)
class StackSettings:
    """Redis, storage, the local stack and the client commands."""

    redis_url: str = STACK(
        "SPLATQ_REDIS_URL",
        "redis://127.0.0.1:6379/0",
        shown="embedded in `make up`; else `redis://127.0.0.1:6379/0`",
        doc="`redis://host:port/db`, or `redis+cluster://host:port`",
    )
    # True when SPLATQ_REDIS_URL was not set: `splatq up` then starts its own redis-server.
    redis_url_is_default: bool = True
    storage_url: str = STACK(
        "SPLATQ_STORAGE_URL",
        "",
        shown="`file://<data dir>/artifacts`",
        doc="object storage for inputs and artifacts: `file:///abs/path` or `s3://bucket/prefix`",
    )
    s3_endpoint_url: str = STACK(
        "SPLATQ_S3_ENDPOINT_URL",
        "",
        doc="S3-compatible endpoint for `s3://` storage (MinIO, R2, moto)",
    )
    public_url: str = STACK(
        "SPLATQ_PUBLIC_URL",
        "",
        parse=p.parse_base_url,
        shown="`http://127.0.0.1:<SPLATQ_GATEWAY_PORT>`",
        doc="base of artifact links in jobs and events",
    )
    redis_wait_replicas: int = STACK(
        "SPLATQ_REDIS_WAIT_REPLICAS",
        0,
        shown="0 (off)",
        doc="opt-in durability across a failover: WAIT for this many replicas after a job is"
        " accepted (else 503 `not_replicated`) and after a result is committed, so a failover"
        " loses neither ([docs/cluster.md](docs/cluster.md)); 0 = asynchronous replication",
    )
    redis_wait_timeout_ms: int = STACK(
        "SPLATQ_REDIS_WAIT_TIMEOUT_MS", 500, minimum=1, doc="the longest such WAIT"
    )
    # What the `splatq submit|status|cancel` client commands talk to.
    api_url: str = STACK(
        "SPLATQ_API_URL",
        "",
        parse=p.parse_base_url,
        shown="the local gateway",
        doc="the gateway `splatq submit/status/cancel/jobs` talk to",
    )
    api_key: str = STACK("SPLATQ_API_KEY", "", doc="the API key they use")
    # (RUF009: a declaration returns a dataclasses.field, not a shared default instance.)
    data_dir: Path = STACK(  # noqa: RUF009
        "SPLATQ_DATA_DIR",
        Path("var"),
        doc="where `splatq up` keeps `redis/`, `artifacts/` and `dev-api-key`",
    )
    embedded_redis_port: int = STACK(
        "SPLATQ_EMBEDDED_REDIS_PORT",
        6390,
        minimum=1,
        doc="the port of the redis-server `splatq up` embeds (when `SPLATQ_REDIS_URL` is not set)",
    )


@dataclass(frozen=True, slots=True)
class GatewaySettings(StackSettings):
    """The gateway: listeners, request and image limits, admission control."""

    gateway_port: int = GATEWAY("SPLATQ_GATEWAY_PORT", 8080, doc="the port the gateway listens on")
    gateway_host: str = GATEWAY("SPLATQ_GATEWAY_HOST", "0.0.0.0", doc="the address it listens on")
    max_upload_bytes: int = GATEWAY(
        "SPLATQ_MAX_UPLOAD_BYTES",
        20 * 1024 * 1024,
        minimum=1024,
        shown="20 MiB",
        doc="request size limit (uploads, and `image_url` fetches)",
    )
    # Phone photos (48-64 MP) fit; a JPEG decodes DCT-scaled (shared/images/headers.py).
    max_image_pixels: int = GATEWAY(
        "SPLATQ_MAX_IMAGE_PIXELS",
        80_000_000,
        minimum=1,
        doc="image size limit, the pixels judged upright (48-64 MP phone photos fit)",
    )
    # Pre-decode bounds on an upload (shared/images/headers.py), checked by the gateway and
    # the worker from the file's structure before any decode.
    max_decode_bytes: int = GATEWAY(
        "SPLATQ_MAX_DECODE_BYTES",
        300 * 1024 * 1024,
        minimum=1024,
        shown="300 MiB",
        doc="checked from the file's structure before any decode, by the gateway and the"
        " worker: bytes the decoded image may take at its decode's peak (JPEG at 1/8 scale;"
        " HEIC whole, its planes and RGB image at once: 6 bytes a pixel, so a 50 MP HEIC fits)",
    )
    max_jpeg_scans: int = GATEWAY(
        "SPLATQ_MAX_JPEG_SCANS",
        32,
        minimum=1,
        doc="scans of a progressive JPEG, checked before decoding (422 `image_too_complex`)",
    )
    decode_concurrency: int = GATEWAY(
        "SPLATQ_DECODE_CONCURRENCY",
        4,
        minimum=1,
        doc="uploads decoded at once per gateway process (then 503 `overloaded`)",
    )
    decode_concurrency_per_tenant: int = GATEWAY(
        "SPLATQ_DECODE_CONCURRENCY_PER_TENANT",
        2,
        minimum=1,
        doc="uploads decoded at once per API key and gateway process (then 429 `too_many_decodes`)",
    )
    decode_wait_s: float = GATEWAY(
        "SPLATQ_DECODE_WAIT_S", 2.0, lo=0.0, hi=60.0, doc="the longest wait for a decode slot"
    )
    # Admission control: per-tenant token bucket, and per-stream-partition backlog limits
    # beyond which submissions are refused (503) instead of queued forever.
    rate_limit_per_s: float = GATEWAY(
        "SPLATQ_RATE_LIMIT_PER_S", 20.0, lo=0.001, hi=1e6, doc="per-tenant token bucket: rate"
    )
    rate_limit_burst: int = GATEWAY(
        "SPLATQ_RATE_LIMIT_BURST", 40, minimum=1, doc="per-tenant token bucket: burst"
    )
    list_rate_limit_per_s: float = GATEWAY(
        "SPLATQ_LIST_RATE_LIMIT_PER_S",
        10.0,
        lo=0.001,
        hi=1e6,
        doc="per-tenant token bucket of `GET /v1/jobs`, a budget of its own (429 `rate_limited`)",
    )
    list_rate_limit_burst: int = GATEWAY(
        "SPLATQ_LIST_RATE_LIMIT_BURST", 20, minimum=1, doc="its burst"
    )
    max_backlog_interactive: int = GATEWAY(
        "SPLATQ_MAX_BACKLOG_INTERACTIVE",
        10_000,
        doc="interactive jobs waiting per stream partition; beyond it, 503",
    )
    max_backlog_synthesis: int = GATEWAY(
        "SPLATQ_MAX_BACKLOG_SYNTHESIS",
        2_000,
        doc="synthesis jobs waiting per stream partition; beyond it, 503",
    )
    tenant_backlog_share: float = GATEWAY(
        "SPLATQ_TENANT_BACKLOG_SHARE",
        0.25,
        lo=0.001,
        hi=1.0,
        doc="one tenant's share of each stream partition's backlog; past it that tenant alone"
        " gets 429 `tenant_backlog_full` while the others still submit (1.0 = off)",
    )
    sse_keepalive_s: float = GATEWAY(
        "SPLATQ_SSE_KEEPALIVE_S", 15.0, lo=0.05, hi=300, doc="SSE keep-alive comment interval"
    )
    # An idle keep-alive connection is closed after aiohttp's 75 s.
    header_timeout_s: float = GATEWAY(
        "SPLATQ_HEADER_TIMEOUT_S",
        10.0,
        lo=0.1,
        hi=600.0,
        doc="slow clients: a request's headers must arrive within this of its first byte (of"
        " the connection's start, for the first); else 408 `request_timeout` and the"
        " connection is closed",
    )
    body_timeout_s: float = GATEWAY(
        "SPLATQ_BODY_TIMEOUT_S",
        60.0,
        lo=0.1,
        hi=3600.0,
        doc="slow clients: a request's body must arrive within this of the handler starting to"
        " read it; else 408 `request_timeout` and the connection is closed",
    )
    image_url_timeout_s: float = GATEWAY(
        "SPLATQ_IMAGE_URL_TIMEOUT_S",
        10.0,
        lo=0.1,
        hi=300.0,
        doc="time limit of a whole `image_url` fetch (its size limit: `SPLATQ_MAX_UPLOAD_BYTES`)",
    )
    prefer_wait_max_s: int = GATEWAY(
        "SPLATQ_PREFER_WAIT_MAX_S",
        60,
        doc="longest `Prefer: wait=N` honoured on `POST /v1/jobs` (a larger N is clamped)",
    )
    image_url_allow_private: bool = GATEWAY(
        "SPLATQ_IMAGE_URL_ALLOW_PRIVATE",
        False,
        doc="`1` lets an `image_url` fetch reach loopback/private addresses (development only)",
    )
    image_url_fetches_per_tenant: int = GATEWAY(
        "SPLATQ_IMAGE_URL_FETCHES_PER_TENANT",
        4,
        minimum=1,
        doc="`image_url` fetches in flight per API key and gateway process (then 429"
        " `too_many_fetches`)",
    )
    # Each stream holds one connection of the SSE pool (its own, sized to the process cap),
    # never one of the pool every other request shares.
    sse_max_streams: int = GATEWAY(
        "SPLATQ_SSE_MAX_STREAMS",
        512,
        minimum=1,
        doc="open event streams per gateway process; beyond it 429 `too_many_streams` (streams"
        " have their own Redis pool of this size)",
    )
    sse_max_streams_per_tenant: int = GATEWAY(
        "SPLATQ_SSE_MAX_STREAMS_PER_TENANT",
        32,
        minimum=1,
        doc="open event streams per API key and gateway process; beyond it 429 `too_many_streams`",
    )
    redis_max_connections: int = GATEWAY(
        "SPLATQ_REDIS_MAX_CONNECTIONS",
        256,
        minimum=1,
        doc="the gateway's shared Redis pool (every request but SSE's blocking reads)",
    )


@dataclass(frozen=True, slots=True)
class TenantSettings(GatewaySettings):
    """Tenants, API keys, the admin API and GPU quotas."""

    api_keys: Mapping[str, str] = TENANTS(
        "SPLATQ_API_KEYS",
        {},
        parse=p.parse_api_keys,
        shown="in `make up`: the dev key kept in `var/dev-api-key`",
        doc="`tenant:key,tenant2:key2` (more tenants and keys live in Redis: `splatq tenants`,"
        " `splatq keys`)",
    )
    admin_api_key: str = TENANTS(
        "SPLATQ_ADMIN_API_KEY",
        "",
        shown="— (admin API off)",
        doc="key of the admin API (`/v1/admin/...`: tenants, keys, quotas); at least 32 visible"
        " ASCII characters, 10 different, or nothing starts",
    )
    admin_auth_failures_per_min: int = TENANTS(
        "SPLATQ_ADMIN_AUTH_FAILURES_PER_MIN",
        10,
        minimum=1,
        doc="failed admin authentications per minute per client address, per gateway process;"
        " past it, 429 `too_many_auth_failures`",
    )
    admin_auth_failures_global_per_min: int = TENANTS(
        "SPLATQ_ADMIN_AUTH_FAILURES_GLOBAL_PER_MIN",
        60,
        minimum=1,
        doc="failed admin authentications per minute in all, per gateway process; past it,"
        " 429 `too_many_auth_failures`",
    )
    admin_port: int = TENANTS(
        "SPLATQ_ADMIN_PORT",
        0,
        shown="0 (the public listener)",
        doc="a listener of its own for the admin API; the public one then answers 404 for"
        " `/v1/admin/*`",
    )
    admin_host: str = TENANTS(
        "SPLATQ_ADMIN_HOST", "", shown="`SPLATQ_GATEWAY_HOST`", doc="the admin listener's address"
    )
    api_key_cache_s: float = TENANTS(
        "SPLATQ_API_KEY_CACHE_S",
        5.0,
        lo=0.0,
        hi=300.0,
        doc="how long a gateway reuses a Redis key lookup while the key registry's version is"
        " unchanged (a revoke or rotation takes effect at once)",
    )
    api_key_cache_size: int = TENANTS(
        "SPLATQ_API_KEY_CACHE_SIZE", 10_000, minimum=1, doc="keys in that cache per process"
    )
    # GPU quotas: GPU time reserved per job at submission, by quality (settled to the
    # measured time when it completes).
    quota_estimates_ms: Mapping[str, int] = TENANTS(
        "SPLATQ_QUOTA_ESTIMATE_S",
        DEFAULT_QUOTA_ESTIMATES_MS,
        parse=p.parse_quota_estimates,
        shown="`preview:15,full:120`",
        doc="GPU-seconds reserved per job at submission, by quality (admission only: the charge"
        " is the measured work)",
    )
    quota_sweep_interval_s: float = TENANTS(
        "SPLATQ_QUOTA_SWEEP_INTERVAL_S",
        60.0,
        lo=0.01,
        hi=86400.0,
        doc="the quota settler's sweep of reservations whose job ended unseen: its interval",
    )
    quota_sweep_grace_s: float = TENANTS(
        "SPLATQ_QUOTA_SWEEP_GRACE_S",
        600.0,
        lo=0.0,
        hi=30 * 86400.0,
        doc="how old a reservation must be before the sweep looks at it",
    )
    quota_reclaim_idle_ms: int = TENANTS(
        "SPLATQ_QUOTA_RECLAIM_IDLE_MS",
        30_000,
        minimum=10,
        doc="how long a dead settler's unacknowledged events wait before another settler takes"
        " them",
    )
    # Failures the tenant is charged for: every other failure is the platform's, and waived
    # (shared/tenants/charging.py).
    quota_charged_failure_codes: frozenset[str] = TENANTS(
        "SPLATQ_QUOTA_CHARGED_FAILURE_CODES",
        DEFAULT_CHARGED_FAILURE_CODES,
        parse=p.parse_codes,
        doc="failures the tenant is charged for; others are waived ([charging"
        " policy](docs/api.md#api-keys-gpu-quotas-and-usage)); `none` = none",
    )
