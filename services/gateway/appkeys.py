"""The gateway application's keys: what `create_app` puts in the app (and a request's trace id),
in a module of their own so that handlers reach them without importing the app's factory
(the app imports the handlers, never the other way round)."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CollectorRegistry

from splatq.services.gateway.admission import Admission
from splatq.services.gateway.decode_slots import DecodeSlots
from splatq.services.gateway.metrics import GatewayMetrics
from splatq.services.gateway.stream_caps import StreamCaps
from splatq.shared.engine.queue import JobQueue
from splatq.shared.images.headers import DecodeLimits
from splatq.shared.redis.replica_wait import ReplicaWait
from splatq.shared.settings import Settings
from splatq.shared.storage.store import Storage
from splatq.shared.tenants.quota import QuotaBook
from splatq.shared.tenants.store import TenantStore

SETTINGS = web.AppKey("settings", Settings)
QUEUE = web.AppKey("queue", JobQueue)
# The same engine API on the SSE pool: blocking reads only (see redis_ctx).
SSE_QUEUE = web.AppKey("sse_queue", JobQueue)
# WAIT after an accepted job (SPLATQ_REDIS_WAIT_REPLICAS; disabled when 0).
REPLICA_WAIT = web.AppKey("replica_wait", ReplicaWait)
STREAM_CAPS = web.AppKey("stream_caps", StreamCaps)
STORAGE = web.AppKey("storage", Storage)
METRICS = web.AppKey("metrics", GatewayMetrics)
REGISTRY_KEY = web.AppKey("registry", CollectorRegistry)
DECODE_SLOTS = web.AppKey("decode_slots", DecodeSlots)
DECODE_LIMITS = web.AppKey("decode_limits", DecodeLimits)
TENANTS = web.AppKey("tenants", TenantStore)
QUOTAS = web.AppKey("quotas", QuotaBook)
# What decides a submission once its image is valid (admission.py).
ADMISSION = web.AppKey("admission", Admission)
TRACE_ID = web.RequestKey("trace_id", str)
