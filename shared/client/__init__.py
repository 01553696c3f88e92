"""A typed client for the splatq HTTP API: `SplatqClient` (async) and `SyncSplatqClient`
(blocking; works inside a running event loop too): submit (a file, bytes or an `image_url`;
`wait_s` for `Prefer: wait`), get, cancel, wait/run, events, download, list_jobs/iter_jobs.

HTTP only, no engine imports and no torch: what a user's program or the `splatq` CLI uses to
talk to a gateway. API errors surface as `ApiProblem` with the contract's stable `code`.
"""

from splatq.shared.client.aio import SplatqClient
from splatq.shared.client.retry import NO_RETRIES, RetryPolicy, parse_retry_after
from splatq.shared.client.sync import SyncSplatqClient
from splatq.shared.client.types import ApiProblem, Event, Job, JobPage, JobStage
from splatq.shared.engine.jobs import JobError

__all__ = [
    "NO_RETRIES",
    "ApiProblem",
    "Event",
    "Job",
    "JobError",
    "JobPage",
    "JobStage",
    "RetryPolicy",
    "SplatqClient",
    "SyncSplatqClient",
    "parse_retry_after",
]
