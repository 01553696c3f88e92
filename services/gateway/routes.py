"""The HTTP API of the public contract: submit, get, cancel, artifacts, events (SSE),
health, metrics and the OpenAPI document.

Handlers translate HTTP to engine calls and back; policy lives in `shared/` and `submission`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import math

import orjson
import structlog
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from redis.exceptions import RedisError

from splatq.services.gateway import docs_page, listing, quota_gate, upstream
from splatq.services.gateway.admin import add_admin_routes
from splatq.services.gateway.admin_ops import add_admin_ops_routes
from splatq.services.gateway.app import (
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
    TRACE_ID,
)
from splatq.services.gateway.auth import authenticate
from splatq.services.gateway.console import add_console_routes
from splatq.services.gateway.endpoints import add_endpoint_routes
from splatq.services.gateway.image_fetch import IMAGE_FETCHER
from splatq.services.gateway.images import (
    INLINE_MAX_BYTES,
    ImageRejected,
    ValidatedImage,
    decode_upload,
    decodes_inline,
    inspect_upload,
    validate_image,
)
from splatq.services.gateway.openapi import openapi_document
from splatq.services.gateway.problems import ApiError, invalid_request, not_found
from splatq.services.gateway.result_cache import RESULT_CACHE, CacheState
from splatq.services.gateway.server import NO_STORE
from splatq.services.gateway.submission import (
    Submission,
    idempotency_key,
    prefer_headers,
    read_submission,
)
from splatq.services.gateway.tenant_policies import TENANT_POLICIES
from splatq.services.gateway.views import job_view, rfc3339, valid_stream_id
from splatq.services.gateway.waiting import preferred_wait, wait_until_finished
from splatq.shared.engine import listing as engine_listing
from splatq.shared.engine.events import TERMINAL_EVENTS
from splatq.shared.engine.fairness import TenantPolicy
from splatq.shared.engine.ids import is_job_id, partition_of
from splatq.shared.engine.jobs import QUALITY_STREAMS, JobRecord, JobSpec
from splatq.shared.engine.keys import StreamName
from splatq.shared.engine.queue import EnqueueResult, JobQueue
from splatq.shared.engine.stages import PipelineStage, StageStatus
from splatq.shared.engine.states import TERMINAL
from splatq.shared.redis.retry import while_refused
from splatq.shared.storage.store import (
    ARTIFACTS,
    QUICK_VARIANT,
    ObjectNotFound,
    artifact_key,
    input_key,
    is_quick_run,
)
from splatq.shared.webhooks.store import WebhookStore

log = structlog.get_logger("splatq.gateway")

OVERLOAD_RETRY_AFTER_S = 5
STREAMS_RETRY_AFTER_S = 5
# A claim whose job failed or was canceled is no claim (see `_enqueue`); how many such
# claims in a row a submission steps over before it gives up single-flight.
MAX_STALE_CLAIM_HOPS = 3
# How long a submission waits out a Redis refusal for now (TRYAGAIN, CLUSTERDOWN) before 503.
ENQUEUE_RETRY_BUDGET_S = 3.0


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/jobs", submit_job)
    app.router.add_get("/v1/jobs", list_jobs)
    app.router.add_get("/v1/jobs/{job_id}", get_job)
    app.router.add_post("/v1/jobs/{job_id}/cancel", cancel_job)
    app.router.add_get("/v1/jobs/{job_id}/artifacts/{name}", get_artifact)
    app.router.add_get("/v1/jobs/{job_id}/events", job_events)
    app.router.add_get("/v1/jobs/{job_id}/deliveries", job_deliveries)
    app.router.add_get("/v1/webhook-secret", webhook_secret)
    app.router.add_post("/v1/webhook-secret/rotate", rotate_webhook_secret)
    add_endpoint_routes(app)
    app.router.add_get("/v1/usage", usage)
    add_admin_routes(app)
    add_admin_ops_routes(app)
    upstream.install(app, app[SETTINGS])  # the result cache's admin, the vendor's webhook
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/openapi.json", openapi)
    app.router.add_get("/docs", docs)
    add_console_routes(app)  # /console, and / leading there


def _json(body: object, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        status=status, body=orjson.dumps(body), content_type="application/json", headers=headers
    )


async def _owned_job(request: web.Request, tenant: str) -> JobRecord:
    """The job of the URL if it exists and belongs to `tenant`; else 404 (never 403)."""
    job_id = request.match_info["job_id"]
    if not is_job_id(job_id):
        raise not_found()
    queue = request.app[QUEUE]
    if partition_of(job_id) >= queue.settings.partitions:
        raise not_found()
    job = await queue.get(job_id)
    if job is None or job.tenant != tenant:
        raise not_found()
    return job


# -- submit -------------------------------------------------------------------------------


async def submit_job(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    queue = request.app[QUEUE]
    counter = request.app[METRICS].submissions
    tenant = await authenticate(request)
    allowed, retry_ms = await queue.take_tokens(
        tenant, settings.rate_limit_per_s, settings.rate_limit_burst
    )
    if not allowed:
        counter.labels("rate_limited").inc()
        raise _rate_limited(retry_ms, "submissions")
    idem_header = idempotency_key(request)
    prefer = prefer_headers(request)
    submission = await read_submission(
        request,
        settings.max_upload_bytes,
        settings.webhook_allow_private,
        body_timeout_s=settings.body_timeout_s,
    )
    if submission.image_url:
        fetched = await request.app[IMAGE_FETCHER].fetch(tenant, submission.image_url)
        submission = dataclasses.replace(submission, image=fetched)
    image = await _validated_image(
        request, tenant, submission.image, from_url=bool(submission.image_url)
    )
    params = submission.params
    cache = request.app[RESULT_CACHE]
    content_key = await cache.content_key(
        queue.redis, tenant, image.sha256, params.quality, params.progressive
    )

    logical_key = f"idempotency:{tenant}:{idem_header}" if idem_header else ""
    stream = QUALITY_STREAMS[params.quality]
    # The tenant's scheduling terms: a capped tenant's jobs and claims live in its home
    # partition, so every claim lookup below routes with them.
    policy = await request.app[TENANT_POLICIES].get(tenant, stream)
    # A completed identical job is answered at once (cache), unless the client opted out;
    # a key already in use goes on to its own job (same request) or to 422 (another one).
    looked = None
    if params.cache and not (idem_header and await _key_in_use(queue, tenant, logical_key, policy)):
        looked = await cache.lookup(queue, tenant, content_key, policy)
        content_key = looked.key  # past the hard TTL: the successor key (see result_cache)

    if not idem_header and params.cache:
        logical_key = content_key  # single-flight: identical submissions share one job
    spec = JobSpec(
        tenant=tenant,
        quality=params.quality,
        params=params.canonical(),
        metadata=params.metadata or {},
        input_ref=input_key(image.sha256, image.extension),
        input_sha256=image.sha256,
        model=settings.model,
        webhook_url=params.webhook_url,
        webhook_events=params.webhook_events,
        trace_id=request[TRACE_ID],
        idempotency_key=logical_key,
        request_fingerprint=submission.request_fingerprint(image.sha256),
    )
    if looked is not None and looked.job is not None:
        counter.labels("cached").inc()
        stale = looked.state is CacheState.STALE
        if stale and not looked.refreshing:
            await _refresh(request, queue, spec, looked.key, submission, image, policy)
        return _json(job_view(looked.job, settings.public_base_url, cached=True, stale=stale))
    response, job, created = await _enqueue(
        request, queue, spec, submission, image, stream, bool(idem_header), policy
    )
    if created and idem_header and params.cache:
        await _claim_content(queue, tenant, content_key, job.id, policy)
    await _confirm_replicated(request, queue, job.id)
    wait_s = preferred_wait(prefer, settings.prefer_wait_max_s)
    if wait_s and response.status == 202:
        return await _answer_after_wait(request, tenant, job.id, wait_s, response)
    return response


def _rate_limited(retry_ms: int, what: str) -> ApiError:
    return ApiError(
        429,
        "rate_limited",
        f"too many {what} for this API key",
        {"Retry-After": str(max(1, math.ceil(retry_ms / 1000)))},
    )


async def _answer_after_wait(
    request: web.Request, tenant: str, job_id: str, wait_s: int, accepted: web.Response
) -> web.Response:
    """`Prefer: wait=N`: 200 with the job if it ends within N seconds, else the 202. The
    wait holds an SSE slot (it is a blocking read on that pool); with none free the 202 goes
    at once, without Preference-Applied."""
    caps = request.app[STREAM_CAPS]
    if caps.try_open(tenant) is not None:
        return accepted
    try:
        block_cap_ms = max(50, int(request.app[SETTINGS].sse_keepalive_s * 1000))
        ended = await wait_until_finished(request.app[SSE_QUEUE], job_id, wait_s, block_cap_ms)
    finally:
        caps.close(tenant)
    applied = {"Preference-Applied": f"wait={wait_s}"}
    job = await request.app[QUEUE].get(job_id) if ended else None
    if job is None:
        accepted.headers.update(applied)
        return accepted
    base = request.app[SETTINGS].public_base_url
    return _json(job_view(job, base), 200, {"Location": f"/v1/jobs/{job_id}", **applied})


async def _confirm_replicated(request: web.Request, queue: JobQueue, job_id: str) -> None:
    """With SPLATQ_REDIS_WAIT_REPLICAS, a job is accepted only once that many replicas have
    it (a failover then cannot lose it); otherwise 503, and the client's retry of the same
    submission finds the same job (single-flight or its Idempotency-Key) and waits again."""
    wait = request.app[REPLICA_WAIT]
    if not wait.enabled:
        return
    acked = await wait.after_write(queue.keys.job(job_id), job_id=job_id)
    if acked < wait.replicas:
        request.app[METRICS].submissions.labels("not_replicated").inc()
        raise ApiError(
            503,
            "not_replicated",
            f"the job is stored but not yet on {wait.replicas} Redis replica(s); retry the"
            " same request",
            {"Retry-After": "1"},
        )


async def _validated_image(
    request: web.Request, tenant: str, data: bytes, from_url: bool = False
) -> ValidatedImage:
    """The pre-decode gate once, then the decode under the tenant's and the process's decode
    slots. An upload of at most INLINE_MAX_BYTES is inspected on the loop (a walk bounded by
    its size), and decoded there too when that costs less than the hop to a decode thread;
    larger ones are inspected and decoded on the pool."""
    settings = request.app[SETTINGS]
    slots = request.app[DECODE_SLOTS]
    try:
        if len(data) > INLINE_MAX_BYTES:
            validate = functools.partial(
                validate_image,
                max_pixels=settings.max_image_pixels,
                max_decode_bytes=settings.max_decode_bytes,
                max_jpeg_scans=settings.max_jpeg_scans,
            )
            return await slots.run(tenant, validate, data)
        limits = request.app[DECODE_LIMITS]
        header = inspect_upload(data, limits)
        decode = functools.partial(decode_upload, header=header, max_pixels=limits.max_pixels)
        if decodes_inline(data, header):
            return await slots.run_inline(tenant, decode, data)
        return await slots.run(tenant, decode, data)
    except ImageRejected as exc:
        request.app[METRICS].submissions.labels(exc.code).inc()
        if from_url and exc.status == 415:
            # The request's own media type was fine: what the URL served is not an image.
            raise ApiError(422, "invalid_image", f"image_url: {exc.detail}") from None
        raise ApiError(exc.status, exc.code, exc.detail) from None


async def _refresh(
    request: web.Request,
    queue: JobQueue,
    spec: JobSpec,
    key: str,
    submission: Submission,
    image: ValidatedImage,
    policy: TenantPolicy,
) -> None:
    """A stale hit's one background refresh: a job of the tenant's under the stale job's
    successor key `key` (identical stale hits share it, so a hundred make one job), without
    the request's webhook or metadata (it is the cache's, not this request's). It is the
    tenant's like any job (quota, backlog share); a refusal leaves the stale answer standing
    and is counted, never returned."""
    refresh = dataclasses.replace(
        spec, idempotency_key=key, webhook_url="", webhook_events=(), metadata={}
    )
    try:
        await _enqueue(request, queue, refresh, submission, image, spec.stream, False, policy)
    except ApiError as exc:
        request.app[METRICS].submissions.labels("refresh_refused").inc()
        log.info("cache.refresh_refused", code=exc.code, tenant=spec.tenant)


async def _key_in_use(queue: JobQueue, tenant: str, logical_key: str, policy: TenantPolicy) -> bool:
    claim = await queue.claim_status(logical_key, policy, tenant)
    return claim is not None and claim[0] != "FAILED"


async def _claim_content(
    queue: JobQueue, tenant: str, content_key: str, job_id: str, policy: TenantPolicy
) -> None:
    """Record a new keyed job under its content key too, so that identical submissions
    without the key join it while it runs and are answered from the cache once it completed.

    The engine moves one claim per job (here the Idempotency-Key's); this one stays PENDING,
    so readers judge by the job's status (the result cache, and `_enqueue` steps over a claim
    whose job failed). Losing it to an identical job that holds it already is fine.
    """
    await queue.claim(content_key, job_id, policy, tenant)


async def _enqueue_once(
    request: web.Request,
    queue: JobQueue,
    spec: JobSpec,
    limit: int,
    tenant_limit: int,
    policy: TenantPolicy,
) -> EnqueueResult:
    """Reserve the job's GPU quota under a fresh job id (429 `quota_exceeded`), then enqueue,
    waiting out a refusal for now (a slot in migration answers TRYAGAIN until its keys have
    moved; a failover, CLUSTERDOWN) for up to ENQUEUE_RETRY_BUDGET_S: the script did not
    run, so sending it again is safe. Longer than that, the client gets 503 (and the
    reservation, whose job may or may not exist, is left to the settler's sweep). A
    submission that did not create its job gives the reservation back at once."""
    job_id = queue.new_job_id(spec, policy)
    gate = await quota_gate.reserve(request, spec, job_id, policy)
    result = await while_refused(
        lambda: queue.enqueue(
            spec,
            max_backlog=limit,
            max_tenant_backlog=tenant_limit,
            policy=policy,
            job_id=job_id,
            join_only=not gate.reserved,
        ),
        ENQUEUE_RETRY_BUDGET_S,
        "enqueue",
    )
    if result.not_joined and gate.refusal is not None:
        # The job the key named ended between the gate and the enqueue: no reservation, no job.
        quota_gate.refused(request)
        raise gate.refusal
    if gate.reserved and not result.created:
        await quota_gate.release_refused(request, spec.tenant, job_id)
    return result


async def _enqueue(
    request: web.Request,
    queue: JobQueue,
    spec: JobSpec,
    submission: Submission,
    image: ValidatedImage,
    stream: StreamName,
    keyed: bool,
    policy: TenantPolicy,
) -> tuple[web.Response, JobRecord, bool]:
    """Store the input, enqueue; (the answer, its job, whether the job is new)."""
    settings = request.app[SETTINGS]
    storage = request.app[STORAGE]
    counter = request.app[METRICS].submissions
    limit = (
        settings.max_backlog_interactive
        if stream == StreamName.INTERACTIVE
        else settings.max_backlog_synthesis
    )
    tenant_limit = settings.tenant_backlog_limit(limit)
    # Store the input first: once the job is in the stream a worker may start it at once.
    # Inputs are content-addressed, so a repeat or a concurrent twin writes the same object
    # (storing one that exists refreshes its age, which retention's grace relies on). A
    # refusal (quota, overload) leaves it: a concurrent identical submission may have found
    # it stored and named it in its job; retention deletes it once no job needs it.
    await storage.put_if_absent(spec.input_ref, submission.image)
    result = await _enqueue_once(request, queue, spec, limit, tenant_limit, policy)
    job = result.job
    hops = 0
    while not keyed and not result.created and not result.overloaded:
        job = await queue.get(result.job_id)
        if job is None or job.status not in {"failed", "canceled"}:
            break
        if hops == MAX_STALE_CLAIM_HOPS:
            spec = dataclasses.replace(spec, idempotency_key="")  # compute, without a claim
        else:
            # The claim outlived its job's failure (a keyed job's content claim, a dead
            # letter's claim): a failed or canceled job never blocks a resubmission. The
            # successor key keeps identical resubmissions on one new job.
            hops += 1
            spec = dataclasses.replace(
                spec, idempotency_key=f"{spec.idempotency_key}|after:{result.job_id}"
            )
        result = await _enqueue_once(request, queue, spec, limit, tenant_limit, policy)
        job = result.job
    if result.overloaded:
        # The input stays: a concurrent identical submission (another tenant's, or one that
        # was accepted) may have found it stored and named it in its job. Retention deletes
        # it once no job needs it and it is past its age (docs/operations.md#retention).
        if result.overload_scope == "tenant":
            # This tenant's own share of the queue is full; every other tenant still submits.
            counter.labels("tenant_backlog_full").inc()
            raise ApiError(
                429,
                "tenant_backlog_full",
                f"this tenant already has {result.backlog} unfinished {stream.value} jobs, its"
                " share of the queue; retry when some have finished",
                {"Retry-After": str(OVERLOAD_RETRY_AFTER_S)},
            )
        counter.labels("overloaded").inc()
        raise ApiError(
            503,
            "overloaded",
            f"the {stream.value} queue is full ({result.backlog} jobs); retry later",
            {"Retry-After": str(OVERLOAD_RETRY_AFTER_S)},
        )
    job = job or await queue.get(result.job_id)
    if job is None:  # the claimed job expired between the claim and this read
        raise ApiError(503, "overloaded", "retry the request", {"Retry-After": "1"})
    base = settings.public_base_url
    location = {"Location": f"/v1/jobs/{job.id}"}
    if result.created:
        counter.labels("created").inc()
        log.info(
            "job.submitted",
            job_id=job.id,
            tenant=job.tenant,
            stream=stream.value,
            quality=spec.quality,
        )
        return _json(job_view(job, base), 202, location), job, True
    if keyed and job.request_fingerprint != spec.request_fingerprint:
        counter.labels("idempotency_key_reused").inc()
        raise ApiError(
            422, "idempotency_key_reused", "this Idempotency-Key was used with a different request"
        )
    if job.status == "completed":
        counter.labels("cached").inc()
        return _json(job_view(job, base, cached=not keyed), 200, location), job, False
    counter.labels("duplicate").inc()
    return _json(job_view(job, base), 202, location), job, False


# -- read, list, cancel, artifacts --------------------------------------------------------


async def list_jobs(request: web.Request) -> web.Response:
    """The caller's jobs, newest first (shared/engine/listing.py, gateway/listing.py): a
    page examines O(limit) index entries (a short page carries a cursor to go on from), and
    each tenant's listings have their own token bucket (429 `rate_limited`)."""
    settings = request.app[SETTINGS]
    tenant = await authenticate(request)
    query = listing.parse_query(request.query)
    allowed, retry_ms = await request.app[QUEUE].take_tokens(
        tenant, settings.list_rate_limit_per_s, settings.list_rate_limit_burst, bucket="list"
    )
    if not allowed:
        raise _rate_limited(retry_ms, "listings")
    page = await engine_listing.list_jobs(
        request.app[QUEUE], tenant, query.limit, query.job_filter, query.after
    )
    base = settings.public_base_url
    cursor = (
        listing.encode_cursor(page.next, query.filter_digest()) if page.next is not None else None
    )
    url = listing.next_url(request, base, cursor) if cursor else None
    headers = {"Link": f'<{url}>; rel="next"'} if url else None
    body = {
        "items": [job_view(job, base) for job in page.jobs],
        "next_cursor": cursor,
        "next": url,
    }
    return _json(body, headers=headers)


async def get_job(request: web.Request) -> web.Response:
    tenant = await authenticate(request)
    job = await _owned_job(request, tenant)
    return _json(job_view(job, request.app[SETTINGS].public_base_url))


async def cancel_job(request: web.Request) -> web.Response:
    tenant = await authenticate(request)
    job = await _owned_job(request, tenant)
    queue = request.app[QUEUE]
    outcome = await queue.cancel(job.id, tenant)
    if outcome == "not_found":
        raise not_found()
    if outcome == "already_finished":
        raise ApiError(409, "already_finished", f"the job is already {job.status.value}")
    updated = await queue.get(job.id)
    assert updated is not None
    return _json(job_view(updated, request.app[SETTINGS].public_base_url), 202)


async def get_artifact(request: web.Request) -> web.StreamResponse:
    """An artifact of the job's result, or (`?variant=quick`) of a progressive job's quick
    result, announced by `preview_ready`."""
    tenant = await authenticate(request)
    variant = request.query.get("variant", "")
    if variant not in ("", QUICK_VARIANT):
        raise invalid_request(f"variant must be {QUICK_VARIANT!r} (or absent: the result)")
    job = await _owned_job(request, tenant)
    name = request.match_info["name"]
    if name not in ARTIFACTS:
        raise not_found("artifact")
    filename, content_type = ARTIFACTS[name]
    if variant:
        run = _quick_run_of(job)
        key = artifact_key(job.id, filename, run)
        filename = f"{QUICK_VARIANT}-{filename}"
    else:
        if job.status != "completed":
            raise ApiError(
                409,
                "not_ready",
                f"the job is {job.status.value}; artifacts exist only for completed jobs",
            )
        key = artifact_key(job.id, filename, job.artifact_run)
    return await _serve_object(request, job.id, key, filename, content_type)


def _quick_run_of(job: JobRecord) -> str:
    """The folder of a progressive job's quick result: the job's `quick_run` (written with
    `preview_ready`, by announce.lua), else its reconstruct ledger record's; 404 for a job
    that never asked for one or ended without one, 409 `not_ready` while it may still come."""
    if job.params.get("progressive") is not True:
        raise ApiError(
            404, "not_found", "no quick result: the job was not submitted with progressive"
        )
    if is_quick_run(job.quick_run):
        return job.quick_run
    record = job.ledger.get(PipelineStage.RECONSTRUCT)
    run = record.facts.get("quick_run", "") if record is not None else ""
    if record is not None and record.status is StageStatus.SUCCEEDED and is_quick_run(run):
        return run
    if job.status in TERMINAL:
        raise ApiError(404, "not_found", f"the job is {job.status.value} without a quick result")
    raise ApiError(
        409, "not_ready", f"the quick result is not ready yet (the job is {job.status.value})"
    )


async def _serve_object(
    request: web.Request, job_id: str, key: str, filename: str, content_type: str
) -> web.StreamResponse:
    storage = request.app[STORAGE]
    presign = getattr(storage, "presigned_get_url", None)
    if presign is not None:
        return web.Response(status=302, headers={"Location": await presign(key, filename=filename)})
    path_of = getattr(storage, "path_of", None)
    if path_of is not None:
        path = path_of(key)
        if not await asyncio.to_thread(path.is_file):
            raise not_found("artifact")
        return web.FileResponse(
            path,
            headers={
                "Content-Type": content_type,
                "Content-Disposition": f'attachment; filename="{job_id}-{filename}"',
            },
        )
    try:
        data = await storage.get_bytes(key)
    except ObjectNotFound:
        raise not_found("artifact") from None
    return web.Response(body=data, content_type=content_type)


# -- events (SSE) -------------------------------------------------------------------------


async def job_events(request: web.Request) -> web.StreamResponse:
    """The job's events as Server-Sent Events, resumable with Last-Event-ID; the stream ends
    after the terminal event. Open streams are capped per tenant and per process (429)."""
    tenant = await authenticate(request)
    job = await _owned_job(request, tenant)
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


# -- webhooks -------------------------------------------------------------------------------


async def job_deliveries(request: web.Request) -> web.Response:
    """Every webhook delivery attempt for this job, oldest first."""
    tenant = await authenticate(request)
    job = await _owned_job(request, tenant)
    store = WebhookStore(request.app[QUEUE])
    return _json({"job_id": job.id, "deliveries": await store.deliveries(job.id)})


async def webhook_secret(request: web.Request) -> web.Response:
    """The tenant's signing secret for per-job webhook_urls (created on first use)."""
    tenant = await authenticate(request)
    store = WebhookStore(request.app[QUEUE])
    secret = await store.tenant_secret(tenant)
    return _secret_response(secret, await store.previous_secret_expires_ms(tenant))


async def rotate_webhook_secret(request: web.Request) -> web.Response:
    """A new tenant secret; deliveries carry signatures with both for the overlap."""
    tenant = await authenticate(request)
    store = WebhookStore(request.app[QUEUE])
    secret = await store.rotate_tenant_secret(tenant)
    return _secret_response(secret, await store.previous_secret_expires_ms(tenant))


def _secret_response(secret: str, previous_expires_ms: int) -> web.Response:
    return _json(
        {
            "secret": secret,
            "scheme": "Standard Webhooks (v1, HMAC-SHA256)",
            "previous_secret_expires_at": rfc3339(previous_expires_ms),
        },
        headers=dict(NO_STORE),
    )


# -- quota ----------------------------------------------------------------------------------


async def usage(request: web.Request) -> web.Response:
    """The calling tenant's GPU quota in the current period: quota, reserved, used, reset."""
    tenant = await authenticate(request)
    return _json(quota_gate.usage_view(await request.app[QUOTAS].usage(tenant)))


# -- operations -----------------------------------------------------------------------------


async def healthz(request: web.Request) -> web.Response:
    return _json({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    try:
        await asyncio.wait_for(request.app[QUEUE].redis.ping(), timeout=2)  # type: ignore[arg-type]
    except Exception as exc:
        raise ApiError(503, "not_ready", f"redis unreachable: {type(exc).__name__}") from None
    return _json({"status": "ready"})


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[REGISTRY_KEY])
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def openapi(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    return _json(openapi_document(settings.public_base_url, settings.prefer_wait_max_s))


@functools.lru_cache(maxsize=4)
def _docs_html(base_url: str, max_wait_s: int) -> bytes:
    return docs_page.render(openapi_document(base_url, max_wait_s)).encode()


async def docs(request: web.Request) -> web.Response:
    """The API reference page (services/gateway/docs_page.py): no script, no outside resource."""
    return web.Response(
        body=_docs_html(
            request.app[SETTINGS].public_base_url, request.app[SETTINGS].prefer_wait_max_s
        ),
        content_type="text/html",
        charset="utf-8",
        headers={
            "Content-Security-Policy": docs_page.CONTENT_SECURITY_POLICY,
            "X-Content-Type-Options": "nosniff",
            "Cache-Control": "public, max-age=300",
        },
    )
