"""Fair scheduling under a SIGKILL: a capped tenant's running count survives the death of the
worker running its jobs (the reaper's takeover keeps the jobs counted, their terminal exits
free the slots), every job completes once, and the bookkeeping ends empty."""

from __future__ import annotations

import signal

import pytest
from redis.asyncio import Redis

from splatq.shared.engine.fairness import TenantPolicy
from splatq.shared.engine.jobs import JobSpec
from splatq.shared.engine.keys import StreamName
from splatq.shared.engine.queue import JobQueue
from splatq.shared.redis.server import RedisServer
from splatq.shared.testing import eventually, job_events, wait_for_status
from tests.shared.test_fairness import assert_bookkeeping_clean
from tests.system.conftest import SpawnWorker

pytestmark = pytest.mark.slow


async def test_a_capped_tenant_keeps_its_cap_through_a_worker_sigkill(
    queue: JobQueue, redis: Redis, redis_server: RedisServer, spawn_worker: SpawnWorker
) -> None:
    capped = TenantPolicy(max_running=2)
    a_ids = [
        (
            await queue.enqueue(
                JobSpec(tenant="A", quality="full", metadata={"sleep_s": 0.6, "n": i}),
                policy=capped,
            )
        ).job_id
        for i in range(6)
    ]
    b_ids = [
        (await queue.enqueue(JobSpec(tenant="B", quality="full", metadata={"sleep_s": 0.3}))).job_id
        for _ in range(4)
    ]
    victim = spawn_worker(redis_server.url, SPLATQ_INTERACTIVE_SHARE="0")

    async def two_a_running() -> bool:
        jobs = [await queue.get(j) for j in a_ids]
        return sum(1 for j in jobs if j is not None and j.status.value == "processing") == 2

    await eventually(two_a_running, timeout=20)
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=10)
    spawn_worker(redis_server.url, SPLATQ_INTERACTIVE_SHARE="0")
    jobs = [await wait_for_status(queue, j, {"completed"}, timeout=40) for j in a_ids + b_ids]
    for job in jobs:
        types = await job_events(redis, queue, job.id)
        assert types.count("3d_reconstruction.completed") == 1
    # the final runs of A's jobs never overlapped more than the cap
    spans = sorted((j.started_at_ms or 0, j.completed_at_ms or 0) for j in jobs if j.tenant == "A")
    peak = max(sum(1 for s, e in spans if s <= start < e) for start, _ in spans)
    assert peak <= 2, spans
    interrupted = [j for j in jobs if j.tenant == "A" and j.attempts == 2]
    assert len(interrupted) == 2, [(j.id, j.attempts) for j in jobs]

    async def clean() -> bool:
        try:
            await assert_bookkeeping_clean(redis, queue)
        except AssertionError:
            return False
        return True

    await eventually(clean, timeout=5)
    assert await redis.hget(f"{queue.keys.fair_base(0, StreamName.SYNTHESIS)}:state", "r:A") is None
