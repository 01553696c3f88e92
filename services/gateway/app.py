"""The aiohttp application: `create_app(settings)` wires Redis, storage, metrics and routes.

Handlers only translate HTTP to engine calls (`JobQueue`, `Storage`); errors are `ApiError`s
rendered once, as problem+json, by the middleware here, which also maps an unreachable Redis
or storage to 503 `unavailable` and a client that went away to no error at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import structlog
from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client import REGISTRY, CollectorRegistry
from redis.exceptions import (
    AskError,
    BusyLoadingError,
    ClusterError,
    MovedError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from splatq.services.gateway import image_fetch, listeners, result_cache, routes, server
from splatq.services.gateway.admission import Admission
from splatq.services.gateway.appkeys import (
    ADMISSION,
    DECODE_LIMITS,
    DECODE_SLOTS,
    METRICS,
    QUEUE,
    QUOTAS,
    REGISTRY_KEY,
    REPLICA_WAIT,
    SETTINGS,
    SSE_QUEUE,
    STORAGE,
    STREAM_CAPS,
    TENANTS,
    TRACE_ID,
)
from splatq.services.gateway.auth import KEY_RESOLVER, KeyResolver, authenticate_admin
from splatq.services.gateway.auth_throttle import ADMIN_THROTTLE, FailureThrottle
from splatq.services.gateway.decode_slots import DecodeSlots
from splatq.services.gateway.images import decode_limits
from splatq.services.gateway.metrics import GatewayMetrics, method_label
from splatq.services.gateway.problems import ApiError, problem_response
from splatq.services.gateway.result_cache import RESULT_CACHE
from splatq.services.gateway.stream_caps import StreamCaps
from splatq.services.gateway.tenant_policies import TENANT_POLICIES, TenantPolicies
from splatq.shared import tracing
from splatq.shared.engine.fairness import fairness_of
from splatq.shared.engine.ids import new_trace_id
from splatq.shared.engine.metrics import QueueMetrics, register_build_info
from splatq.shared.engine.queue import JobQueue
from splatq.shared.redis import tuning
from splatq.shared.redis.client import connect
from splatq.shared.redis.replica_wait import ReplicaWait
from splatq.shared.settings import Settings
from splatq.shared.storage.store import Storage, StorageUnavailable, open_storage
from splatq.shared.tenants.quota import QuotaBook
from splatq.shared.tenants.store import TenantStore

log = structlog.get_logger("splatq.gateway")


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_TRACEPARENT_LEN = 55
UNAVAILABLE_RETRY_AFTER_S = 5
# What an unreachable, loading, failing-over or full Redis raises, and storage that is down:
# the request may succeed later, so 503 with Retry-After, not a 500.
UNAVAILABLE_ERRORS = (
    RedisConnectionError,
    RedisTimeoutError,
    ClusterError,  # ClusterDownError, MasterDownError, and "TTL exhausted" (redirects)
    AskError,  # a redirect that escaped the client (a slot in migration): retry
    MovedError,
    NoScriptError,  # a node that lost its script cache (failover) past the reload budget
    SlotNotCoveredError,  # a cluster client between slot maps (a failover)
    TryAgainError,
    ReadOnlyError,
    OutOfMemoryError,
    BusyLoadingError,
    StorageUnavailable,
)
PROBE_ROUTES = frozenset({"/healthz", "/readyz", "/metrics"})
# nginx's "client closed request": counted, never as a server error.
CLIENT_CLOSED_STATUS = 499


# Generated request ids: a random per-process prefix and a counter, unique across processes
# without a system call per request (getrandom cost 10-40 us per call on the benchmark VM).
_REQUEST_ID_PREFIX = secrets.token_hex(4)
_request_counter = itertools.count(1)


def _request_id(request: web.Request) -> str:
    """The caller's X-Request-ID when it is visible ASCII (it is echoed in a header and in
    logs), else a new one."""
    given = request.headers.get("X-Request-ID", "")[:128]
    if given and given.isascii() and given.isprintable():
        return given
    return f"{_REQUEST_ID_PREFIX}{next(_request_counter):08x}"


def _trace_id(request: web.Request) -> str:
    """W3C traceparent's trace id when the caller sent one, else a new one."""
    tp = request.headers.get("traceparent", "")
    if len(tp) == _TRACEPARENT_LEN and tp[2] == "-" and tp[35] == "-":
        candidate = tp[3:35]
        if all(c in "0123456789abcdef" for c in candidate) and candidate != "0" * 32:
            return candidate
    return new_trace_id()


def _error_for(request: web.Request, exc: Exception) -> ApiError:
    """The API error a handler's exception answers as (a redirect is re-raised)."""
    if isinstance(exc, ApiError):
        error = exc
    elif isinstance(exc, web.HTTPRequestEntityTooLarge):
        error = ApiError(413, "payload_too_large", "request too large")
    elif isinstance(exc, web.HTTPNotFound):
        error = ApiError(404, "not_found", "no such resource")
    elif isinstance(exc, web.HTTPMethodNotAllowed):
        error = ApiError(
            405,
            "method_not_allowed",
            f"{request.method} is not allowed here",
            {"Allow": ",".join(sorted(exc.allowed_methods))},
        )
    elif isinstance(exc, web.HTTPException):
        if exc.status < 400:
            raise exc  # redirects and the like are not errors
        error = ApiError(exc.status, "http_error", exc.reason)
    elif isinstance(exc, UNAVAILABLE_ERRORS):
        log.warning("http.unavailable", error=type(exc).__name__, detail=str(exc)[:300])
        error = ApiError(
            503,
            "unavailable",
            "the job store is unreachable; retry later",
            {"Retry-After": str(UNAVAILABLE_RETRY_AFTER_S)},
        )
    else:
        log.exception("http.unhandled", path=request.path)
        error = ApiError(500, "internal_error", "unexpected error")
    return error


@web.middleware
async def observe(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Request/trace ids on every response and log line; access log; problem+json errors; the
    listener's screen (listeners.screen) before the handler."""
    request_id = _request_id(request)
    trace_id = _trace_id(request)
    request[TRACE_ID] = trace_id
    structlog.contextvars.bind_contextvars(request_id=request_id, trace_id=trace_id)
    started = time.perf_counter()
    resource = request.match_info.route.resource
    route = resource.canonical if resource is not None else "unmatched"
    status = 500
    try:
        try:
            settings = request.app[SETTINGS]
            if listeners.screen(request, settings):
                await authenticate_admin(request, settings.admin_api_key)
            response = await handler(request)
        except (asyncio.CancelledError, ConnectionResetError):
            # The client went away (aiohttp ignores the error once it is re-raised); the
            # request ends here, and that is nobody's fault.
            status = CLIENT_CLOSED_STATUS
            raise
        except Exception as exc:
            response = problem_response(_error_for(request, exc))
        status = response.status
        if status == 408:
            response.force_close()  # a client too slow to send its request: let it go
        if not response.prepared:
            response.headers["X-Request-ID"] = request_id
            response.headers["X-Trace-ID"] = trace_id
        return response
    finally:
        elapsed = time.perf_counter() - started
        method = method_label(request.method)
        metrics = request.app[METRICS]
        metrics.requests.labels(route, method, str(status)).inc()
        metrics.latency.labels(route).observe(elapsed)
        # Probes and scrapes every few seconds are debug lines, not the access log.
        (log.debug if route in PROBE_ROUTES else log.info)(
            "http.request",
            method=method,
            route=route,
            status=status,
            duration_ms=round(elapsed * 1000, 2),
        )
        structlog.contextvars.unbind_contextvars("request_id", "trace_id")


@web.middleware
async def trace_request(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A server span per request, in the request's trace (installed only when tracing is on;
    inside `observe`, which has set the trace id)."""
    resource = request.match_info.route.resource
    route = resource.canonical if resource is not None else "unmatched"
    attributes: dict[str, tracing.AttributeValue] = {
        "http.request.method": request.method,
        "http.route": route,
    }
    with tracing.span(
        f"{method_label(request.method)} {route}",
        request[TRACE_ID],
        kind="server",
        carrier=request.headers,
        attributes=attributes,
    ) as span:
        try:
            response = await handler(request)
        except ApiError as exc:
            if span is not None:
                span.set_attribute("http.response.status_code", exc.status)
            raise
        if span is not None:
            span.set_attribute("http.response.status_code", response.status)
        return response


def create_app(
    settings: Settings,
    storage: Storage | None = None,
    registry: CollectorRegistry = REGISTRY,
) -> web.Application:
    """The gateway application; resources open in `cleanup_ctx` and close with the app."""
    middlewares: list[Middleware] = [observe]
    if tracing.enabled():
        middlewares.append(trace_request)
    app = web.Application(
        middlewares=middlewares,
        client_max_size=settings.max_upload_bytes + 256 * 1024,
    )
    app[SETTINGS] = settings
    app[METRICS] = GatewayMetrics.create(registry)
    app[REGISTRY_KEY] = registry
    app[DECODE_SLOTS] = DecodeSlots(
        settings.decode_concurrency, settings.decode_concurrency_per_tenant, settings.decode_wait_s
    )
    app[DECODE_LIMITS] = decode_limits(
        settings.max_image_pixels, settings.max_decode_bytes, settings.max_jpeg_scans
    )
    app[STORAGE] = storage or open_storage(
        settings.storage_url, settings.storage_root, s3_endpoint_url=settings.s3_endpoint_url
    )
    app[STREAM_CAPS] = StreamCaps(settings.sse_max_streams, settings.sse_max_streams_per_tenant)
    app[ADMIN_THROTTLE] = FailureThrottle(
        settings.admin_auth_failures_per_min, settings.admin_auth_failures_global_per_min
    )
    queue_metrics = QueueMetrics.create(registry)
    register_build_info(registry, "gateway")

    async def redis_ctx(app: web.Application) -> AsyncIterator[None]:
        redis = connect(
            settings.redis_url,
            client_name="splatq-gateway",
            max_connections=settings.redis_max_connections,
        )
        # A blocking read (XREAD BLOCK) holds its connection for up to a keep-alive interval;
        # on the shared pool a few hundred streams starved every other request. Streams get
        # their own pool, one connection per stream the caps admit, so it never waits.
        sse_redis = connect(
            settings.redis_url,
            client_name="splatq-gateway-sse",
            max_connections=settings.sse_max_streams,
        )
        queue = JobQueue(redis, settings)
        await queue.setup()
        for problem in await tuning.check(redis):
            log.warning("redis.config", problem=problem)
        app[QUEUE] = queue
        app[SSE_QUEUE] = JobQueue(sse_redis, settings)
        app[TENANTS] = TenantStore(redis)
        app[QUOTAS] = QuotaBook(redis)
        app[TENANT_POLICIES] = TenantPolicies(
            app[TENANTS],
            fairness_of(settings),
            settings.api_key_cache_s,
            settings.api_key_cache_size,
        )
        app[KEY_RESOLVER] = KeyResolver(
            settings.api_keys, app[TENANTS], settings.api_key_cache_s, settings.api_key_cache_size
        )
        app[REPLICA_WAIT] = ReplicaWait(
            redis, settings.redis_wait_replicas, settings.redis_wait_timeout_ms
        )
        app[ADMISSION] = Admission(
            settings,
            queue,
            app[STORAGE],
            app[QUOTAS],
            app[RESULT_CACHE],
            app[TENANT_POLICIES],
            app[REPLICA_WAIT],
            app[METRICS].submissions,
        )
        sampler = asyncio.create_task(_sample_queues(queue_metrics, queue))
        yield
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
        await app[REPLICA_WAIT].aclose()
        await redis.aclose()
        await sse_redis.aclose()
        close = getattr(app[STORAGE], "close", None)
        if close is not None:
            await close()

    app.cleanup_ctx.append(redis_ctx)
    server.install_headers(app)
    image_fetch.install(app, settings)
    result_cache.install(app, settings, app[METRICS].cache_lookups)
    app.on_cleanup.append(_close_decode_slots)
    routes.add_routes(app)
    return app


async def _close_decode_slots(app: web.Application) -> None:
    app[DECODE_SLOTS].close()


async def _sample_queues(metrics: QueueMetrics, queue: JobQueue) -> None:
    while True:
        with contextlib.suppress(Exception):
            await metrics.sample(queue, tuple(range(queue.settings.partitions)))
        await asyncio.sleep(5)
