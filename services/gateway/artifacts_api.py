"""GET /v1/jobs/{id}/artifacts/{name}: a job's results (and a progressive job's quick ones),
served from local storage or redirected to a presigned URL."""

from __future__ import annotations

import asyncio

import structlog
from aiohttp import web

from splatq.services.gateway.appkeys import STORAGE
from splatq.services.gateway.auth import authenticate
from splatq.services.gateway.problems import ApiError, invalid_request, not_found
from splatq.services.gateway.responses import owned_job
from splatq.shared.engine.jobs import JobRecord
from splatq.shared.engine.stages import PipelineStage, StageStatus
from splatq.shared.engine.states import TERMINAL
from splatq.shared.storage.store import (
    ARTIFACTS,
    QUICK_VARIANT,
    ObjectNotFound,
    artifact_key,
    is_quick_run,
)

log = structlog.get_logger("splatq.gateway")
OVERLOAD_RETRY_AFTER_S = 5
STREAMS_RETRY_AFTER_S = 5


async def get_artifact(request: web.Request) -> web.StreamResponse:
    """An artifact of the job's result, or (`?variant=quick`) of a progressive job's quick
    result, announced by `preview_ready`."""
    tenant = await authenticate(request)
    variant = request.query.get("variant", "")
    if variant not in ("", QUICK_VARIANT):
        raise invalid_request(f"variant must be {QUICK_VARIANT!r} (or absent: the result)")
    job = await owned_job(request, tenant)
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
