"""The engine under production faults, through a fault-injection proxy in front of a real
redis-server: replies lost after the command ran, outages longer than a lease, error replies
(OOM, a Lua error on a corrupt record, WRONGTYPE) and outcomes Redis cannot encode."""

from __future__ import annotations

import asyncio

import pytest
import structlog
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from splatq.shared.engine.events import EventType
from splatq.shared.engine.fairness import TenantPolicy
from splatq.shared.engine.job_context import JobContext
from splatq.shared.engine.jobs import JobOutcome, JobSpec
from splatq.shared.engine.keys import StreamName
from splatq.shared.engine.queue import Finish, JobQueue
from splatq.shared.engine.reaper import Reaper
from splatq.shared.engine.scripts import Script
from splatq.shared.engine.unstarted import Unstarted
from splatq.shared.engine.worker import Worker
from splatq.shared.errors import CORRUPT_JOB_RECORD, INVALID_OUTCOME
from splatq.shared.redis.client import connect
from splatq.shared.redis.server import RedisServer, free_port
from splatq.shared.settings import Settings
from splatq.shared.testing import (
    WorkerFactory,
    engine_settings,
    eventually,
    finish_or_cancel,
    wait_for_status,
)
from tests.fault_fixtures import own_server, proxied, proxy, sha
from tests.faultproxy import FaultProxy
from tests.helpers import spec

__all__ = ["own_server", "proxied", "proxy"]  # fixtures
from tests.handlers import BehaviourHandler, runs_key

# -- lost replies: every resend answers what the first execution did -------------------------


async def test_enqueue_whose_reply_is_lost_answers_created_once(
    proxied: JobQueue, proxy: FaultProxy, redis: Redis
) -> None:
    """The reply of enqueue is lost after Redis ran it: the resend answers `created` with the
    job (not 'job id collision'), and exactly one job and one stream entry exist."""
    proxy.lose_reply_after(sha(proxied, Script.ENQUEUE))
    result = await proxied.enqueue(spec())
    assert proxy.lost_replies == 1
    assert result.created
    assert result.job is not None
    assert result.job.id == result.job_id
    assert await redis.xlen(proxied.keys.stream(0, StreamName.INTERACTIVE)) == 1
    assert len(await redis.keys("splatq:{p0}:job:*[0-9A-Z]")) == 1


async def test_cancel_whose_reply_is_lost_answers_canceled(
    proxied: JobQueue, proxy: FaultProxy
) -> None:
    """A queued job's cancel ran but its reply was lost: the resend answers `canceled` (what
    happened), not `already_finished`."""
    result = await proxied.enqueue(spec())
    proxy.lose_reply_after(sha(proxied, Script.CANCEL))
    assert await proxied.cancel(result.job_id) == "canceled"
    assert proxy.lost_replies == 1
    job = await proxied.get(result.job_id)
    assert job is not None
    assert job.status.value == "canceled"


async def test_take_whose_reply_is_lost_hands_over_the_started_job(
    proxied: JobQueue, proxy: FaultProxy
) -> None:
    """take started a job but its reply was lost: the resend returns that job with the token
    its lease holds, instead of leaving it processing under a lease no task holds."""
    result = await proxied.enqueue(spec())
    proxy.lose_reply_after(sha(proxied, Script.TAKE))
    taken = await proxied.take(0, {StreamName.INTERACTIVE: 1}, 0, "c1", resend_for_s=5)
    assert proxy.lost_replies == 1
    assert [t.outcome for t in taken] == ["started"]
    assert taken[0].job is not None
    assert taken[0].job.id == result.job_id
    assert await proxied.redis.get(proxied.keys.lease(result.job_id)) == taken[0].token


async def test_take_whose_record_read_loses_its_reply_reads_it_again(
    proxied: JobQueue, proxy: FaultProxy
) -> None:
    """take answers no record: the worker reads each started job's record itself (HGETALL).
    That read's reply is lost: it is read again, and the run is handed over once, with the
    record the start wrote (processing, its lease token, the attempt counted once)."""
    result = await proxied.enqueue(spec())
    proxy.lose_reply_after(b"HGETALL")
    taken = await proxied.take(0, {StreamName.INTERACTIVE: 1}, 0, "c1", resend_for_s=5)
    assert proxy.lost_replies == 1
    assert [t.outcome for t in taken] == ["started"]
    job = taken[0].job
    assert job is not None
    assert job.id == result.job_id
    assert job.status.value == "processing"
    assert job.attempts == 1
    assert await proxied.redis.hget(proxied.keys.job(job.id), "lease_token") == taken[0].token


async def test_a_record_taken_over_before_its_read_is_not_handed_over(
    queue: JobQueue, redis: Redis
) -> None:
    """Between the start script's reply and the worker's read of the record, another run took
    the job over (a stall past the lease): the read sees another lease token and answers
    `busy`, so the worker does not run a job it no longer holds; an unreadable record answers
    `corrupt` (failed alone), and the run's own record `started`."""
    ids = [(await queue.enqueue(spec(n=i))).job_id for i in range(3)]
    taken = await queue.take(0, {StreamName.INTERACTIVE: 3}, 0, "c1")
    assert [t.outcome for t in taken] == ["started"] * 3
    by_id = {t.entry.fields["job"]: t for t in taken}
    await redis.hset(queue.keys.job(ids[0]), "lease_token", "another-run")
    await redis.hset(queue.keys.job(ids[1]), "attempts", "x")
    reads = await queue.read_started([(i, by_id[i].token) for i in ids])
    assert [r.outcome for r in reads] == ["busy", "corrupt", "started"]
    assert reads[1].detail.startswith("unreadable job record")
    assert reads[2].job is not None
    assert reads[2].job.id == ids[2]


async def test_a_started_record_refused_for_good_is_an_error_at_once(
    own_server: RedisServer, settings: Settings
) -> None:
    """The worker's Redis user may not read records (an ACL without HGETALL: NOPERM, an
    error reply that waiting does not cure): the take's start happens, its record read
    answers `error` at once instead of being re-read for the whole resend window, and the
    worker logs it as an error (the job is not run; its lease lapses and the reaper
    delivers it again, up to the delivery limit)."""
    admin = connect(own_server.url)
    await admin.execute_command(
        "ACL", "SETUSER", "worker", "on", "nopass", "~*", "&*", "+@all", "-hgetall"
    )
    url = own_server.url.replace("redis://", "redis://worker:x@")
    client = connect(url)
    queue = JobQueue(client, settings.with_overrides(redis_url=url))
    try:
        await queue.setup()
        job_id = (await queue.enqueue(spec())).job_id
        loop = asyncio.get_running_loop()
        started = loop.time()
        taken = await queue.take(0, {StreamName.INTERACTIVE: 1}, 0, "c1", resend_for_s=5)
        assert loop.time() - started < 2.0
        assert [t.outcome for t in taken] == ["error"]
        assert "NOPERM" in taken[0].detail or "permission" in taken[0].detail.lower()
        assert await admin.hget(queue.keys.job(job_id), "status") == "processing"  # type: ignore[misc]
        with structlog.testing.capture_logs() as logs:
            unstarted = Unstarted(queue, Reaper(queue, "c1", 1.0), None, structlog.get_logger())
            await unstarted.handle(taken[0].entry, taken[0].token, "error", taken[0].detail)
        assert [(e["event"], e["log_level"]) for e in logs] == [
            ("job.started_record_unreadable", "error")
        ]
    finally:
        await client.aclose()
        await admin.aclose()


async def test_take_that_fed_jobs_and_lost_its_reply_feeds_them_once(
    proxied: JobQueue, proxy: FaultProxy
) -> None:
    """take moved waiting jobs from a tenant's fair queue into the stream, started them, and
    its reply was lost: the resend hands over the same jobs, and the tenant counts them once
    (a second feed would count its running jobs twice and starve it under a cap)."""
    capped = TenantPolicy(max_running=5)
    ids = [(await proxied.enqueue(spec(n=i), policy=capped)).job_id for i in range(3)]
    proxy.lose_reply_after(sha(proxied, Script.TAKE))
    taken = await proxied.take(0, {StreamName.INTERACTIVE: 3}, 0, "c1", resend_for_s=5)
    assert proxy.lost_replies == 1
    assert sorted(t.job.id for t in taken if t.job is not None) == sorted(ids)
    base = f"{proxied.keys.tag(0)}:fq:interactive"
    assert await proxied.redis.zcard(f"{base}:waiting") == 0
    assert await proxied.redis.hget(f"{base}:state", "r:acme") == "3"


async def test_a_commit_that_freed_a_cap_and_lost_its_reply_feeds_once(
    proxied: JobQueue, proxy: FaultProxy
) -> None:
    """A capped tenant's commit frees its slot and makes its next job ready (the feed in
    finish.lua); the reply is lost. The resend answers from the record's `last_commit` and
    feeds nothing more: one entry ready, the next job counted once."""
    capped = TenantPolicy(max_running=1)
    ids = [(await proxied.enqueue(spec(n=i), policy=capped)).job_id for i in range(3)]
    [first] = await proxied.take(0, {StreamName.INTERACTIVE: 1}, 0, "c1")
    assert first.job is not None
    finish = Finish(first.job.id, first.entry.stream, first.entry.entry_id, first.token,
                    "completed", event=EventType.COMPLETED.value)  # fmt: skip
    proxy.lose_reply_after(sha(proxied, Script.FINISH))
    try:
        answer = await proxied.finish_many([finish])
    except RedisConnectionError:
        answer = await proxied.finish_many([finish])  # the resend: same request id
    assert proxy.lost_replies == 1
    assert answer == [("ok", "completed")]
    stream = proxied.keys.stream(0, StreamName.INTERACTIVE)
    pending = await proxied.redis.xpending(stream, proxied.group)
    assert int(await proxied.redis.xlen(stream)) - int(pending["pending"]) == 1
    base = f"{proxied.keys.tag(0)}:fq:interactive"
    assert await proxied.redis.hget(f"{base}:state", "r:acme") == "1"
    assert await proxied.redis.hget(proxied.keys.job(ids[1]), "fq") == "c"
    assert await proxied.redis.hget(proxied.keys.job(ids[2]), "fq") == "1"  # still waiting


async def test_dead_letter_and_redrive_whose_replies_are_lost_act_once(
    proxied: JobQueue, proxy: FaultProxy, redis: Redis
) -> None:
    """dead_letter_entry writes one dead letter, and redrive answers `redriven` (not `gone`),
    when each one's reply is lost after it ran."""
    stream = proxied.keys.stream(0, StreamName.INTERACTIVE)
    await redis.xadd(stream, {"garbage": "1"})
    [bad] = await proxied.wait_for_new(0, [StreamName.INTERACTIVE], "c1", 100)
    proxy.lose_reply_after(sha(proxied, Script.DEAD_LETTER_ENTRY))
    await proxied.dead_letter_entry(bad, "missing_fields", "no job")
    assert await redis.xlen(proxied.keys.dead_letters(0)) == 1

    result = await proxied.enqueue(spec())
    await redis.hset(proxied.keys.job(result.job_id), "status", "failed")
    await redis.xadd(proxied.keys.dead_letters(0), {"job": result.job_id, "reason": "x"})
    letter = (await proxied.dead_letters(0))[-1]
    proxy.lose_reply_after(sha(proxied, Script.REDRIVE))
    outcome, _ = await proxied.redrive(letter)
    assert proxy.lost_replies == 2
    assert outcome == "redriven"


# -- outages longer than a lease ------------------------------------------------------------


async def test_an_outage_longer_than_the_lease_does_not_rerun_a_healthy_job(
    proxied: JobQueue, proxy: FaultProxy, queue: JobQueue, redis: Redis, settings: Settings
) -> None:
    """A 1.3 s Redis outage (TTL 0.9 s) in the middle of a 2.5 s job: the job keeps running,
    its lapsed lease is re-taken when Redis answers again (nobody else took it), and it
    completes after exactly one run and one attempt."""
    result = await proxied.enqueue(spec(block_s=2.5))
    s = settings.with_overrides(redis_url=proxy.url)
    worker = Worker(proxied, s, BehaviourHandler())
    task = asyncio.create_task(worker.run())
    try:
        await wait_for_status(queue, result.job_id, {"processing"})
        await asyncio.sleep(0.3)
        proxy.outage(1.3)
        job = await wait_for_status(queue, result.job_id, {"completed", "failed"}, 15)
        assert job.status.value == "completed"
        assert job.attempts == 1
        assert job.deliveries == 1
        assert int(await redis.get(runs_key(job.id)) or 0) == 1
    finally:
        worker.stop()
        await finish_or_cancel(task)


async def test_one_error_reply_in_a_heartbeat_batch_fails_only_its_own_renewal(
    queue: JobQueue, redis: Redis, start_worker: WorkerFactory
) -> None:
    """Two jobs renewed in one batch; one's record becomes the wrong type (WRONGTYPE reply
    for its renewal). The other keeps its lease and completes after one run."""
    ttl_s = queue.settings.lease_ttl_ms / 1000
    victim = await queue.enqueue(spec(block_s=3 * ttl_s))
    healthy = await queue.enqueue(spec(block_s=3 * ttl_s))
    await start_worker()
    await wait_for_status(queue, victim.job_id, {"processing"})
    await wait_for_status(queue, healthy.job_id, {"processing"})
    await redis.delete(queue.keys.job(victim.job_id))
    await redis.set(queue.keys.job(victim.job_id), "not a hash")
    job = await wait_for_status(queue, healthy.job_id, {"completed"}, timeout=10)
    assert job.attempts == 1
    assert int(await redis.get(runs_key(healthy.job_id)) or 0) == 1


# -- error replies and corrupt records ------------------------------------------------------


async def _refuse_writes(client: Redis, how: str, port: int) -> None:
    if how == "oom":
        await client.config_set("maxmemory", "1")
    else:  # a replica of a primary that does not answer, as during a failover
        await client.execute_command("REPLICAOF", "127.0.0.1", str(port))


async def _accept_writes(client: Redis, how: str) -> None:
    if how == "oom":
        await client.config_set("maxmemory", "0")
    else:
        await client.execute_command("REPLICAOF", "NO", "ONE")


@pytest.mark.parametrize("how", ["oom", "readonly"])
async def test_error_replies_back_the_worker_off_and_it_keeps_running(
    own_server: RedisServer, how: str
) -> None:
    """With maxmemory reached every script answers OOM; on a replica, READONLY. The worker
    survives either (it does not exit), and completes the waiting job once Redis accepts
    writes again."""
    s = engine_settings(own_server.url)
    client = connect(own_server.url)
    try:
        queue = JobQueue(client, s)
        await queue.setup()
        result = await queue.enqueue(spec())
        await _refuse_writes(client, how, free_port())
        worker = Worker(queue, s, BehaviourHandler())
        task = asyncio.create_task(worker.run())
        try:
            await asyncio.sleep(1.5)  # several fetch attempts, each refused
            assert not task.done(), f"the worker exited on a {how} reply"
            job = await queue.get(result.job_id)
            assert job is not None
            assert job.status.value == "queued"
            await _accept_writes(client, how)
            await wait_for_status(queue, result.job_id, {"completed"}, timeout=10)
        finally:
            worker.stop()
            await finish_or_cancel(task)
    finally:
        await client.aclose()


async def test_a_corrupt_record_is_dead_lettered_and_every_worker_goes_on(
    queue: JobQueue, redis: Redis, start_worker: WorkerFactory
) -> None:
    """A job whose `attempts` is not a number is failed with CORRUPT_JOB_RECORD and
    dead-lettered without a half-applied start (no lease, deliveries unchanged); the job
    behind it completes and the worker keeps running."""
    bad = await queue.enqueue(spec())
    await redis.hset(queue.keys.job(bad.job_id), "attempts", "many")
    good = await queue.enqueue(spec())
    worker = await start_worker()
    await wait_for_status(queue, good.job_id, {"completed"})
    record = await redis.hgetall(queue.keys.job(bad.job_id))  # type: ignore[misc]
    assert record["status"] == "failed"
    assert record["error_code"] == CORRUPT_JOB_RECORD
    assert record.get("deliveries", "0") == "0"  # no delivery counted (0 is implicit)
    assert await redis.get(queue.keys.lease(bad.job_id)) is None
    reasons = [f["reason"] for _, f in await redis.xrange(queue.keys.dead_letters(0))]
    assert reasons == ["corrupt_job_record"]
    assert worker.running_jobs == 0
    again = await queue.enqueue(spec())
    await wait_for_status(queue, again.job_id, {"completed"})


# -- outcomes -------------------------------------------------------------------------------


class _OneBadOutcome:
    """Completes every job; the one whose metadata says `bad` returns a None field."""

    async def __call__(self, ctx: JobContext) -> JobOutcome:
        await asyncio.sleep(0.2)  # let the batch's jobs finish together
        extra = {"note": None} if ctx.job.metadata.get("bad") else {"note": "fine"}
        return JobOutcome(artifacts={}, extra_fields=extra)  # type: ignore[dict-item]


async def test_one_unencodable_outcome_fails_alone_not_its_commit_batch(
    queue: JobQueue, start_worker: WorkerFactory
) -> None:
    """An outcome with None in extra_fields fails its own job (INVALID_OUTCOME); the jobs
    committed in the same batch complete on their first attempt."""
    good = [await queue.enqueue(spec()) for _ in range(3)]
    bad = await queue.enqueue(spec(bad=True))
    await start_worker(_OneBadOutcome())
    failed = await wait_for_status(queue, bad.job_id, {"failed", "completed"})
    assert failed.error is not None
    assert failed.error.code == INVALID_OUTCOME
    for r in good:
        job = await wait_for_status(queue, r.job_id, {"completed"})
        assert job.attempts == 1


# -- partitions -----------------------------------------------------------------------------


async def test_claim_lives_in_the_partition_of_its_key(redis: Redis, settings: Settings) -> None:
    """With several partitions, claim() writes the claim where enqueue and claim_status
    look for it: the key's partition, not the job id's."""
    queue = JobQueue(redis, settings.with_overrides(partitions=4))
    await queue.setup()
    key = next(k for k in (f"key-{i}" for i in range(100)) if queue.keys.partition_for(k) != 0)
    job_id = "job_000" + "A" * 26  # a partition-0 job id
    won = await queue.claim(key, job_id)
    assert won.won
    assert await queue.claim_status(key) == ("PENDING", job_id)
    second = await queue.claim(key, "job_000" + "B" * 26)
    assert not second.won
    assert second.job_id == job_id


async def test_an_unsendable_call_fails_alone_in_its_pipeline(queue: JobQueue) -> None:
    """A script call with an argument Redis cannot encode (None) gets a TypeError of its own;
    the calls beside it in the same pipeline run."""
    from splatq.shared.engine.scripts import ScriptCall  # noqa: PLC0415

    key = queue.keys.idempotency(0, "d")
    good = ScriptCall(Script.CLAIM, [key], ["job_000" + "C" * 26, 1000])
    bad = ScriptCall(Script.CLAIM, [key + "x"], [None, 1000])  # type: ignore[list-item]
    results = await queue.scripts.run_many([bad, good])
    assert isinstance(results[0], TypeError)
    assert results[1][0] == 1


# -- per-tenant backlog -----------------------------------------------------------------------


async def test_a_tenants_backlog_share_is_freed_by_every_way_a_job_ends(
    queue: JobQueue, redis: Redis, start_worker: WorkerFactory
) -> None:
    """With a tenant bound of 1, the tenant's second job is refused (scope 'tenant') while
    another tenant's is not; completion and dead-lettering each free the share."""
    first = await queue.enqueue(spec(), max_tenant_backlog=1)
    refused = await queue.enqueue(spec(), max_tenant_backlog=1)
    assert refused.overloaded
    assert refused.overload_scope == "tenant"
    other = await queue.enqueue(
        JobSpec(tenant="other", quality="preview", metadata={}), max_tenant_backlog=1
    )
    assert other.created
    await start_worker()
    await wait_for_status(queue, first.job_id, {"completed"})
    corrupt = await queue.enqueue(spec(), max_tenant_backlog=1)
    assert corrupt.created
    await redis.hset(queue.keys.job(corrupt.job_id), "attempts", "x")  # dead-lettered on take

    async def admitted() -> bool:
        return (await queue.enqueue(spec(), max_tenant_backlog=1)).created

    await eventually(admitted)


# -- draining -----------------------------------------------------------------------------


async def test_a_drain_during_a_stall_drops_no_commit_already_handed_over(
    proxied: JobQueue, proxy: FaultProxy, queue: JobQueue, redis: Redis, settings: Settings
) -> None:
    """Jobs finish while Redis stalls for longer than the shutdown grace; SIGTERM-style stop
    arrives meanwhile. The outcomes already handed to the committer are still written once
    Redis answers: every job completes after one run (none is left to be re-run)."""
    s = settings.with_overrides(redis_url=proxy.url, shutdown_grace_s=1.0, lease_ttl_ms=5000)
    jobs = [await proxied.enqueue(spec(block_s=0.5)) for _ in range(3)]
    worker = Worker(proxied, s, BehaviourHandler())
    task = asyncio.create_task(worker.run())
    try:
        for j in jobs:
            await wait_for_status(queue, j.job_id, {"processing"})
        stall = asyncio.create_task(proxy.stall(2.0))  # the jobs finish inside the stall
        await asyncio.sleep(0.6)
        worker.stop()
        await stall
        await asyncio.wait_for(task, 10)
        for j in jobs:
            job = await queue.get(j.job_id)
            assert job is not None
            assert job.status.value == "completed"
            assert int(await redis.get(runs_key(j.job_id)) or 0) == 1
    finally:
        worker.stop()
        await finish_or_cancel(task)


async def test_a_lost_jobs_thread_keeps_its_slot_until_it_returns(
    queue: JobQueue, redis: Redis, start_worker: WorkerFactory
) -> None:
    """A job computing in a thread is taken over (its token replaced): its task stops at
    once, but its only slot is not reused until the thread has returned, so the next job
    never computes beside it."""
    lost = await queue.enqueue(spec(block_s=1.5))
    await start_worker(worker_concurrency=1)
    first = await wait_for_status(queue, lost.job_id, {"processing"})
    await redis.hset(queue.keys.job(lost.job_id), "lease_token", "another-worker")
    await redis.set(queue.keys.lease(lost.job_id), "another-worker", px=60_000)
    nxt = await queue.enqueue(spec())
    second = await wait_for_status(queue, nxt.job_id, {"completed"})
    assert first.started_at_ms is not None
    assert second.started_at_ms is not None
    assert second.started_at_ms - first.started_at_ms >= 1400


async def test_a_corrupt_record_met_by_the_reapers_start_is_dead_lettered_too(
    queue: JobQueue, redis: Redis
) -> None:
    """The reaper's path (start.lua) refuses a corrupt record before any write, like take:
    the job fails with CORRUPT_JOB_RECORD and the entry lands in the dead-letter stream."""
    bad = await queue.enqueue(spec())
    await redis.hset(queue.keys.job(bad.job_id), "deliveries", "two")
    [entry] = await queue.wait_for_new(0, [StreamName.INTERACTIVE], "c1", 100)
    [result] = await queue.start_many([entry], ["tok"], "c1")
    assert result.outcome == "dead_lettered"
    assert await redis.hget(queue.keys.job(bad.job_id), "error_code") == CORRUPT_JOB_RECORD
    assert await redis.get(queue.keys.lease(bad.job_id)) is None
    [(_, letter)] = await redis.xrange(queue.keys.dead_letters(0))
    assert letter["reason"] == "corrupt_job_record"
