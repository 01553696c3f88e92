"""The jobs resource: POST /v1/jobs (HTTP's part of a submission; admission.py decides),
GET /v1/jobs (the tenant's listing), GET /v1/jobs/{id} and POST /v1/jobs/{id}/cancel."""

from __future__ import annotations

import dataclasses
import functools
import math

import structlog
from aiohttp import web

from splatq.services.gateway import listing
from splatq.services.gateway.admission import Ask, Cached, Created, Joined, Refused
from splatq.services.gateway.appkeys import (
    ADMISSION,
    DECODE_LIMITS,
    DECODE_SLOTS,
    METRICS,
    QUEUE,
    SETTINGS,
    SSE_QUEUE,
    STREAM_CAPS,
    TRACE_ID,
)
from splatq.services.gateway.auth import authenticate
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
from splatq.services.gateway.problems import ApiError, not_found
from splatq.services.gateway.responses import json_response, owned_job
from splatq.services.gateway.submission import (
    idempotency_key,
    prefer_headers,
    read_submission,
)
from splatq.services.gateway.views import job_view
from splatq.services.gateway.waiting import preferred_wait, wait_until_finished
from splatq.shared.engine import listing as engine_listing

log = structlog.get_logger("splatq.gateway")
OVERLOAD_RETRY_AFTER_S = 5
STREAMS_RETRY_AFTER_S = 5


async def submit_job(request: web.Request) -> web.Response:
    """POST /v1/jobs: authenticate, rate-limit, read and validate the image (HTTP's part),
    then admission (admission.py) decides; its outcome becomes the response."""
    settings = request.app[SETTINGS]
    counter = request.app[METRICS].submissions
    tenant = await authenticate(request)
    allowed, retry_ms = await request.app[QUEUE].take_tokens(
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
    ask = Ask(
        tenant=tenant,
        image=image,
        data=submission.image,
        params=submission.params,
        fingerprint=submission.request_fingerprint(image.sha256),
        idempotency_key=idem_header,
        trace_id=request[TRACE_ID],
    )
    outcome = await request.app[ADMISSION].admit(ask)
    base = settings.public_base_url
    match outcome:
        case Refused(error):
            raise error
        case Cached(job, stale):
            return json_response(job_view(job, base, cached=True, stale=stale))
        case Joined(job, keyed) if job.status == "completed":
            location = {"Location": f"/v1/jobs/{job.id}"}
            return json_response(job_view(job, base, cached=not keyed), 200, location)
        case Created(job) | Joined(job, _):
            response = json_response(job_view(job, base), 202, {"Location": f"/v1/jobs/{job.id}"})
    wait_s = preferred_wait(prefer, settings.prefer_wait_max_s)
    if wait_s:
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
    return json_response(job_view(job, base), 200, {"Location": f"/v1/jobs/{job_id}", **applied})


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
    return json_response(body, headers=headers)


async def get_job(request: web.Request) -> web.Response:
    tenant = await authenticate(request)
    job = await owned_job(request, tenant)
    return json_response(job_view(job, request.app[SETTINGS].public_base_url))


async def cancel_job(request: web.Request) -> web.Response:
    tenant = await authenticate(request)
    job = await owned_job(request, tenant)
    queue = request.app[QUEUE]
    outcome = await queue.cancel(job.id, tenant)
    if outcome == "not_found":
        raise not_found()
    if outcome == "already_finished":
        raise ApiError(409, "already_finished", f"the job is already {job.status.value}")
    updated = await queue.get(job.id)
    assert updated is not None
    return json_response(job_view(updated, request.app[SETTINGS].public_base_url), 202)
