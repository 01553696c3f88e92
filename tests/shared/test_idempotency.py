"""Idempotency claims: one winner under contention, documented statuses, re-submittable
after failure."""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis

from splatq.shared.engine.ids import new_job_id
from splatq.shared.engine.jobs import JobSpec
from splatq.shared.engine.queue import JobQueue
from tests.conftest import WorkerFactory, wait_for_status


async def test_fifty_concurrent_claims_have_exactly_one_winner(queue: JobQueue) -> None:
    """50 claimers of one logical key at once: one wins, the 49 others see the winner's job."""
    ids = [new_job_id(0) for _ in range(50)]
    results = await asyncio.gather(*(queue.claim("tenant-a:key-1", i) for i in ids))
    winners = [r for r in results if r.won]
    assert len(winners) == 1
    assert {r.job_id for r in results} == {winners[0].job_id}


async def test_fifty_concurrent_enqueues_with_one_key_create_one_job(
    queue: JobQueue, redis: Redis
) -> None:
    """Concurrent identical submissions with one key produce one job and one stream entry."""
    specs = [JobSpec(tenant="a", quality="preview", idempotency_key="k") for _ in range(50)]
    results = await asyncio.gather(*(queue.enqueue(s) for s in specs))
    assert sum(r.created for r in results) == 1
    assert len({r.job_id for r in results}) == 1
    stream = queue.keys.stream(queue.keys.partition_for("k"), specs[0].stream)
    assert await redis.xlen(stream) == 1


async def test_claim_follows_the_job_to_completed(
    queue: JobQueue, start_worker: WorkerFactory
) -> None:
    """PENDING at enqueue, COMPLETED after the job completes; a repeat returns the same job."""
    first = await queue.enqueue(JobSpec(tenant="a", quality="preview", idempotency_key="img-1"))
    assert await queue.claim_status("img-1") == ("PENDING", first.job_id)
    await start_worker()
    await wait_for_status(queue, first.job_id, {"completed"})
    assert await queue.claim_status("img-1") == ("COMPLETED", first.job_id)
    again = await queue.enqueue(JobSpec(tenant="a", quality="preview", idempotency_key="img-1"))
    assert (again.created, again.job_id, again.claim_status) == (
        False, first.job_id, "COMPLETED",
    )  # fmt: skip


async def test_a_failed_job_can_be_submitted_again(
    queue: JobQueue, start_worker: WorkerFactory
) -> None:
    """A FAILED claim does not block re-submission (unlike dedup ids that pin failures)."""
    spec = JobSpec(
        tenant="a", quality="preview", idempotency_key="img-2", metadata={"fail": "permanent"}
    )
    first = await queue.enqueue(spec)
    await start_worker()
    await wait_for_status(queue, first.job_id, {"failed"})
    assert await queue.claim_status("img-2") == ("FAILED", first.job_id)
    second = await queue.enqueue(spec)
    assert second.created
    assert second.job_id != first.job_id


async def test_claims_expire_after_the_configured_ttl(queue: JobQueue, redis: Redis) -> None:
    """The claim key carries SPLATQ_IDEMPOTENCY_TTL_S as its expiry."""
    result = await queue.enqueue(JobSpec(tenant="a", quality="preview", idempotency_key="k3"))
    key = queue.keys.idempotency(0, queue.keys.digest("k3"))
    ttl_ms = await redis.pttl(key)
    assert 0 < ttl_ms <= queue.settings.idempotency_ttl_s * 1000
    assert result.created
