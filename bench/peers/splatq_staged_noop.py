"""splatq's staged pipeline with no-op stages: the same jobs as `splatq_noop`, each taken,
run and advanced through every stage (ingest -> reconstruct -> export -> render -> publish,
then its cleanup) by one `splatq worker --stages ...` process. Against `splatq_noop` (one
stage: the whole job) in the same run, it gives the Redis cost of a hop between stages.

Benchmark-only; it uses the public engine API and nothing private.
"""

from __future__ import annotations

from bench.peers import splatq_noop
from splatq.shared.engine.job_context import JobContext, JobHandler
from splatq.shared.engine.jobs import JobOutcome, StageDone
from splatq.shared.engine.keys import STREAMS
from splatq.shared.engine.queue import JobQueue
from splatq.shared.engine.stages import ALL_STAGES, PIPELINE, PipelineStage
from splatq.shared.redis.client import connect
from splatq.shared.settings import Settings

NAME: str = f"{splatq_noop.NAME} (5 stages)"
# Stage hops per job: the four advances between the five stages.
HOPS = len(PIPELINE) - 1
reset = splatq_noop.reset
_EMPTY = JobOutcome()


class NoopStages:
    """Every stage does nothing and succeeds; publish ends the job."""

    def handler(self, stage: PipelineStage) -> JobHandler:
        if stage is PipelineStage.PUBLISH:
            return self._publish
        digest = f"noop-{stage.value}"

        async def run(ctx: JobContext) -> StageDone:
            return StageDone(digest=digest)

        return run

    async def _publish(self, ctx: JobContext) -> JobOutcome:
        return _EMPTY

    async def startup(self, stages: tuple[PipelineStage, ...]) -> None:
        return None

    async def shutdown(self) -> None:
        return None

    async def cleanup(self, job_id: str) -> int:
        return 0


def make(settings: Settings) -> NoopStages:
    return NoopStages()


async def enqueue(redis_url: str, n_jobs: int) -> None:
    await splatq_noop.enqueue(redis_url, n_jobs)


def worker_command(redis_url: str, concurrency: int) -> list[str]:
    """Every stage in one process, each with `concurrency` slots, and the backpressure bound
    above them as docs/operations.md asks (SPLATQ_STAGE_BUFFER counts a stage's running
    jobs: the default 32 under 50 slots held every stage back and polled)."""
    stages = ",".join(s.value for s in ALL_STAGES)
    handlers = "bench.peers.splatq_staged_noop:make"
    buffer = max(32, 2 * concurrency)
    return splatq_noop.worker_command(
        redis_url,
        concurrency,
        runs=("--stages", stages, "--stage-handlers", handlers),
        extra=(f"SPLATQ_STAGE_BUFFER={buffer}",),
    )


async def remaining(redis_url: str) -> int:
    """Jobs not finished: what `splatq_noop` counts (the jobs' own streams, which the first
    stage reads, and the tenants' fair queues) and the entries in every later stage's
    streams (cleanup's included)."""
    client = connect(redis_url)
    try:
        queue = JobQueue(client, Settings(redis_url=redis_url))
        waiting = sum([(await queue.waiting(0, stream)).in_line for stream in STREAMS])
        entries = 0
        for stage in ALL_STAGES[1:]:  # the first stage's streams are the jobs' own
            for stream in STREAMS:
                entries += await client.xlen(queue.keys.stage_stream(0, stage.value, stream))
        return waiting + entries
    finally:
        await client.aclose()
