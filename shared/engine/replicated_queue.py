"""The job queue a worker uses: with SPLATQ_REDIS_WAIT_REPLICAS set, every committed result
is on that many replicas before the worker moves on (a failover then cannot undo a finish,
which would re-run the job and announce its end twice). Without it, the plain `JobQueue`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from redis.asyncio import Redis

from splatq.shared.engine.ids import partition_of
from splatq.shared.engine.queue import Finish, JobQueue
from splatq.shared.redis.replica_wait import ReplicaWait
from splatq.shared.settings import Settings

# Commit outcomes whose script did not run (nothing new to replicate).
_NOT_WRITTEN = frozenset({"transient", "error", "retry"})


class ReplicatedJobQueue(JobQueue):
    """`finish_many`, then one WAIT per partition the batch wrote to (concurrently)."""

    def __init__(self, redis: Redis, settings: Settings) -> None:
        super().__init__(redis, settings)
        self.replica_wait = ReplicaWait(
            redis, settings.redis_wait_replicas, settings.redis_wait_timeout_ms
        )

    async def finish_many(self, requests: Sequence[Finish]) -> list[tuple[str, str]]:
        results = await super().finish_many(requests)
        written = {
            partition_of(f.job_id): f.job_id
            for f, (outcome, _) in zip(requests, results, strict=True)
            if outcome not in _NOT_WRITTEN
        }
        await asyncio.gather(
            *(
                self.replica_wait.after_write(self.keys.job(job_id), partition=p)
                for p, job_id in written.items()
            )
        )
        return results


def open_queue(redis: Redis, settings: Settings) -> JobQueue:
    """The worker's queue for these settings."""
    if settings.redis_wait_replicas > 0:
        return ReplicatedJobQueue(redis, settings)
    return JobQueue(redis, settings)
