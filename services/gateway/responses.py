"""What every handler answers with: a JSON body, and the job a path names when it is the
tenant's own (else 404, the same as for a job that does not exist)."""

from __future__ import annotations

import orjson
from aiohttp import web

from splatq.services.gateway.appkeys import QUEUE
from splatq.services.gateway.problems import not_found
from splatq.shared.engine.ids import is_job_id, partition_of
from splatq.shared.engine.jobs import JobRecord


def json_response(
    body: object, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    return web.Response(
        status=status, body=orjson.dumps(body), content_type="application/json", headers=headers
    )


async def owned_job(request: web.Request, tenant: str) -> JobRecord:
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
