"""Idempotency claims: one winner under contention, documented statuses, re-submittable
after failure."""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis

from splatq.shared.engine.fairness import TenantPolicy, home_partition
from splatq.shared.engine.ids import new_job_id, partition_of
from splatq.shared.engine.jobs import JobSpec
from splatq.shared.engine.queue import JobQueue
from splatq.shared.settings import Settings
from splatq.shared.testing import WorkerFactory, wait_for_status


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


async def test_a_key_answers_with_its_job_whatever_the_tenants_cap_now(
    redis: Redis, settings: Settings
) -> None:
    """With several partitions a running cap routes a tenant's new jobs and claims to its home
    partition; a key claimed under the other route still answers (enqueue, claim,
    claim_status), and a FAILED claim in one place gives way to a live one in the other."""
    queue = JobQueue(redis, settings.with_overrides(partitions=4))
    await queue.setup()
    home = home_partition("acme", 4)
    key = next(
        k for k in (f"idempotency:acme:k{i}" for i in range(100))
        if queue.keys.partition_for(k) != home
    )  # fmt: skip
    capped = TenantPolicy(max_running=2)
    spec = JobSpec(tenant="acme", quality="preview", idempotency_key=key)
    first = await queue.enqueue(spec)
    assert first.created
    assert partition_of(first.job_id) != home
    again = await queue.enqueue(spec, policy=capped)
    assert (again.created, again.job_id, again.claim_status) == (False, first.job_id, "PENDING")
    assert await queue.claim_status(key, capped, "acme") == ("PENDING", first.job_id)
    lost = await queue.claim(key, new_job_id(home), capped, "acme")
    assert (lost.won, lost.job_id) == (False, first.job_id)
    # the first job failed (its claim says so): the key is free, and the new job answers
    own_claim = queue.keys.idempotency(partition_of(first.job_id), queue.keys.digest(key))
    await redis.set(own_claim, f"FAILED {first.job_id}")
    second = await queue.enqueue(spec, policy=capped)
    assert second.created
    assert partition_of(second.job_id) == home
    assert await queue.claim_status(key, None, "acme") == ("PENDING", second.job_id)
    assert not (await queue.enqueue(spec)).created
