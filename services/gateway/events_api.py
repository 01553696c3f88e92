"""GET /v1/jobs/{id}/events: a job's history and live events as Server-Sent Events, resumable
with Last-Event-ID, under the per-tenant and global stream caps."""

from __future__ import annotations

import structlog
from aiohttp import web
from redis.exceptions import RedisError

from splatq.services.gateway.appkeys import (
    METRICS,
    SETTINGS,
    SSE_QUEUE,
    STREAM_CAPS,
)
from splatq.services.gateway.auth import authenticate
from splatq.services.gateway.problems import ApiError
from splatq.services.gateway.responses import owned_job
from splatq.services.gateway.views import valid_stream_id
from splatq.shared.engine.events import TERMINAL_EVENTS

log = structlog.get_logger("splatq.gateway")
OVERLOAD_RETRY_AFTER_S = 5
STREAMS_RETRY_AFTER_S = 5


async def job_events(request: web.Request) -> web.StreamResponse:
    """The job's events as Server-Sent Events, resumable with Last-Event-ID; the stream ends
    after the terminal event. Open streams are capped per tenant and per process (429)."""
    tenant = await authenticate(request)
    job = await owned_job(request, tenant)
    # Sent but empty is malformed too (the document's pattern), not "from the start"; the
    # header wins over the query parameter, and each one sent must be an event id.
    sent = [request.headers.get("Last-Event-ID"), request.query.get("last_event_id")]
    after = next((v for v in sent if v is not None), "0-0")
    if not all(valid_stream_id(v) for v in sent if v is not None):
        raise ApiError(
            400,
            "invalid_request",
            "Last-Event-ID must be an event id of this stream (as sent in the id: field)",
        )
    caps = request.app[STREAM_CAPS]
    refused = caps.try_open(tenant)
    if refused is not None:
        request.app[METRICS].streams_refused.inc()
        raise ApiError(
            429,
            "too_many_streams",
            f"{refused}; close one, or poll GET /v1/jobs/{{id}}",
            {"Retry-After": str(STREAMS_RETRY_AFTER_S)},
        )
    try:
        return await _stream_events(request, job.id, after)
    finally:
        caps.close(tenant)


async def _stream_events(request: web.Request, job_id: str, after: str) -> web.StreamResponse:
    """Write the job's events from `after` on; blocking reads use the SSE pool. A client
    that goes away surfaces as ConnectionResetError at the next write (the middleware
    counts it as 499, not as an error)."""
    settings = request.app[SETTINGS]
    queue = request.app[SSE_QUEUE]
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
        }
    )
    await response.prepare(request)
    block_ms = max(50, int(settings.sse_keepalive_s * 1000))
    while True:
        try:
            events = await queue.job_history(job_id, after, block_ms=block_ms)
        except RedisError as exc:
            # Headers are sent: end the stream; the client resumes with Last-Event-ID.
            log.warning("sse.redis_error", job_id=job_id, error=str(exc))
            await response.write_eof()
            return response
        if not events:
            await response.write(b": keep-alive\n\n")
            continue
        for entry_id, kind, payload in events:
            after = entry_id
            await response.write(f"id: {entry_id}\nevent: {kind}\ndata: {payload}\n\n".encode())
            if kind in TERMINAL_EVENTS:
                await response.write_eof()
                return response
