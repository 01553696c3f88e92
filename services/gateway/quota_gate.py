"""The gateway's words for the GPU-quota saga: what a job is reserved (`estimate_ms`), the
gate's answer, the 429 `quota_exceeded` with the reset time, and GET /v1/usage's body. The
steps themselves run in admission (`admission.Admission._reserve`): the reservation is made
under the job's id before the job exists (`JobQueue.new_job_id`), so the settler and the
sweeper find it by the job; a submission that dies between the two leaves a reservation
without a job, which the sweeper releases after its grace.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass

from splatq.services.gateway.problems import ApiError
from splatq.services.gateway.views import rfc3339
from splatq.shared.tenants.quota import Usage


def estimate_ms(table: Mapping[str, int], quality: str, progressive: bool = False) -> int:
    """The GPU time a job is reserved (SPLATQ_QUOTA_ESTIMATE_S, in ms: `table`): its quality's
    estimate, plus a preview job's for a progressive full job (its quick pass is a
    preview-resolution job's work)."""
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
