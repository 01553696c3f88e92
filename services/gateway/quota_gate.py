"""The gateway's part of the GPU-quota saga: reserve a job's estimated GPU time before the
job is enqueued (429 `quota_exceeded` with the reset time when the tenant's quota cannot
hold it), and give it back when the submission did not create the job.

The reservation is made under the job's id before the job exists (`JobQueue.new_job_id`),
so the settler and the sweeper find it by the job. A submission that dies between the two
leaves a reservation without a job, which the sweeper releases after its grace.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from aiohttp import web

from splatq.services.gateway.app import METRICS, QUEUE, QUOTAS, SETTINGS
from splatq.services.gateway.problems import ApiError
from splatq.services.gateway.views import rfc3339
from splatq.shared.engine.fairness import TenantPolicy
from splatq.shared.engine.jobs import JobSpec
from splatq.shared.tenants.quota import ReleaseReason, Usage


def estimate_ms(request: web.Request, quality: str, progressive: bool = False) -> int:
    """The GPU time a job is reserved: its quality's estimate, plus a preview job's for a
    progressive full job (its quick pass is a preview-resolution job's work)."""
    table = request.app[SETTINGS].quota_estimates_ms
    amount = table.get(quality, max(table.values(), default=0))
    if progressive:
        amount += table.get("preview", 0)
    return amount


@dataclass(frozen=True, slots=True)
class Gate:
    """The quota gate's answer: the job's estimate is reserved under its id, or (a repeat of a
    key whose job exists: it reserved when it was created) the submission may only join that
    job -- `refusal` is the 429 to answer if it turns out not to exist any more."""

    reserved: bool
    refusal: ApiError | None = None


async def reserve(
    request: web.Request, spec: JobSpec, job_id: str, policy: TenantPolicy | None = None
) -> Gate:
    """Reserve the job's estimate, or answer that the submission may only join the job its
    idempotency key names (the tenant is at its quota but that job exists), else 429
    `quota_exceeded`."""
    book = request.app[QUOTAS]
    await book.note_tenant_once(spec.tenant)
    amount = estimate_ms(request, spec.quality, spec.params.get("progressive") is True)
    reservation = await book.reserve(spec.tenant, job_id, amount)
    if reservation.granted:
        return Gate(reserved=True)
    refusal = quota_exceeded(reservation.usage, amount)
    if spec.idempotency_key:
        claim = await request.app[QUEUE].claim_status(spec.idempotency_key, policy, spec.tenant)
        if claim is not None and claim[0] != "FAILED":
            # Join only: the enqueue script creates nothing if the claim ended meanwhile
            # (a cancel raced this request), so no job ever runs without a reservation.
            return Gate(reserved=False, refusal=refusal)
    refused(request)
    raise refusal


def refused(request: web.Request) -> None:
    request.app[METRICS].submissions.labels("quota_exceeded").inc()


async def release_refused(request: web.Request, tenant: str, job_id: str) -> None:
    """Compensation: the submission did not create the job (a duplicate, an overload)."""
    await request.app[QUOTAS].release(tenant, job_id, ReleaseReason.REFUSED)


def quota_exceeded(usage: Usage, requested_ms: int) -> ApiError:
    retry_after = max(1, math.ceil((usage.resets_ms - time.time() * 1000) / 1000))
    limit = usage.limit_ms or 0
    return ApiError(
        429,
        "quota_exceeded",
        f"this job needs an estimated {requested_ms / 1000:g} GPU-seconds; the tenant has"
        f" {(usage.remaining_ms or 0) / 1000:g} of {limit / 1000:g} left this {usage.period}"
        f" (resets at {rfc3339(usage.resets_ms)})",
        {"Retry-After": str(retry_after)},
        {
            "resets_at": rfc3339(usage.resets_ms),
            "period": usage.period.value,
            "quota_gpu_seconds": limit / 1000,
            "used_gpu_seconds": usage.used_ms / 1000,
            "reserved_gpu_seconds": usage.reserved_ms / 1000,
            "requested_gpu_seconds": requested_ms / 1000,
        },
    )


def usage_view(usage: Usage) -> dict[str, object]:
    """GET /v1/usage's body."""

    def seconds(ms: int | None) -> float | None:
        return None if ms is None else ms / 1000

    return {
        "tenant": usage.tenant,
        "period": usage.period.value,
        "period_id": usage.period_id,
        "quota_gpu_seconds": seconds(usage.limit_ms),
        "reserved_gpu_seconds": seconds(usage.reserved_ms),
        "used_gpu_seconds": seconds(usage.used_ms),
        "remaining_gpu_seconds": seconds(usage.remaining_ms),
        "resets_at": rfc3339(usage.resets_ms),
    }
