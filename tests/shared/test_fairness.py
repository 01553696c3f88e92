"""Fair scheduling between tenants: deficit round-robin by cost and weight, per-tenant running
caps held in Redis, cancels of waiting jobs, and the bookkeeping left clean afterwards."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence

from redis.asyncio import Redis

from splatq.shared.engine.events import EventType
from splatq.shared.engine.fairness import TenantPolicy, home_partition
from splatq.shared.engine.job_context import JobContext
from splatq.shared.engine.jobs import JobOutcome, JobSpec
from splatq.shared.engine.keys import StreamName
from splatq.shared.engine.queue import Finish, JobQueue, Taken
from splatq.shared.settings import Settings
from splatq.shared.testing import WorkerFactory, eventually, wait_for_status

SYN = StreamName.SYNTHESIS


def full(tenant: str, n: int = 0) -> JobSpec:
    return JobSpec(tenant=tenant, quality="full", metadata={"n": n})


async def take_one(queue: JobQueue, consumer: str = "c1") -> list[Taken]:
    return [
        t
        for t in await queue.take(0, {}, 1, consumer)
        if t.outcome == "started" and t.job is not None
    ]


async def take_order(queue: JobQueue, count: int) -> list[str]:
    """Tenants of the next `count` jobs one worker slot would start, one take at a time."""
    order: list[str] = []
    for _ in range(count):
        taken = await take_one(queue)
        assert taken, f"nothing to take after {order}"
        order.extend(t.job.tenant for t in taken if t.job is not None)
    return order


async def complete(queue: JobQueue, taken: Sequence[Taken]) -> None:
    await queue.finish_many(
        [
            Finish(
                t.job.id,
                t.entry.stream,
                t.entry.entry_id,
                t.token,
                "completed",
                claim_key=t.entry.fields.get("claim", ""),
                event=EventType.COMPLETED.value,
            )
            for t in taken
            if t.job is not None
        ]
    )


async def assert_bookkeeping_clean(redis: Redis, queue: JobQueue) -> None:
    """Once every job has ended: nobody waits, nobody counts as running, the ring is empty."""
    for stream in (StreamName.INTERACTIVE, SYN):
        base = f"{queue.keys.tag(0)}:fq:{stream.value}"
        assert await redis.zcard(f"{base}:waiting") == 0
        assert await redis.llen(f"{base}:ring") == 0
        assert await redis.hgetall(f"{base}:state") == {}


async def test_a_small_tenant_is_served_between_a_flooding_tenants_jobs(queue: JobQueue) -> None:
    """Tenant A queues 30 jobs, then B queues 3: B's jobs start within A's first few, not
    after all 30 (arrival order)."""
    for i in range(30):
        await queue.enqueue(full("A", i))
    for i in range(3):
        await queue.enqueue(full("B", i))
    order = await take_order(queue, 33)
    b_positions = [i for i, t in enumerate(order) if t == "B"]
    assert len(b_positions) == 3
    # one job already moved into the idle stream at enqueue, then A and B alternate
    assert b_positions[-1] <= 7, order
    assert Counter(order) == {"A": 30, "B": 3}


async def test_arrival_order_when_fair_scheduling_is_off(redis: Redis, settings: Settings) -> None:
    queue = JobQueue(redis, settings.with_overrides(fair_scheduling=False))
    await queue.setup()
    for i in range(10):
        await queue.enqueue(full("A", i))
    for i in range(3):
        await queue.enqueue(full("B", i))
    assert await take_order(queue, 13) == ["A"] * 10 + ["B"] * 3


async def test_weights_share_the_stream_in_proportion(queue: JobQueue) -> None:
    """Weight 3 against weight 1: A gets three jobs for each of B's while both wait."""
    for i in range(40):
        await queue.enqueue(full("A", i), policy=TenantPolicy(weight=3))
        await queue.enqueue(full("B", i), policy=TenantPolicy(weight=1))
    counts = Counter((await take_order(queue, 41))[1:])  # the first moved in at enqueue
    # 3:1 over 40 starts, give or take where the window cuts a round
    assert counts["A"] + counts["B"] == 40
    assert 29 <= counts["A"] <= 31, counts


async def test_cost_makes_a_full_job_worth_ten_previews(redis: Redis, settings: Settings) -> None:
    """Within one stream, cost counts: a tenant of cost-10 jobs gets one job per ten of a
    tenant of cost-1 jobs (same weight)."""
    s = settings.with_overrides(job_costs={"preview": 1, "full": 10, "cheap": 1})
    queue = JobQueue(redis, s)
    await queue.setup()
    from splatq.shared.engine import jobs  # noqa: PLC0415

    original = dict(jobs.QUALITY_STREAMS)
    jobs.QUALITY_STREAMS["cheap"] = SYN  # type: ignore[index]
    try:
        for i in range(30):
            await queue.enqueue(JobSpec(tenant="big", quality="full", metadata={"n": i}))
            await queue.enqueue(JobSpec(tenant="small", quality="cheap", metadata={"n": i}))
        counts = Counter((await take_order(queue, 23))[1:])
    finally:
        jobs.QUALITY_STREAMS.clear()
        jobs.QUALITY_STREAMS.update(original)  # type: ignore[attr-defined]
    # ten cheap jobs per full one, give or take where the window cuts a round
    assert counts["small"] + counts["big"] == 22
    assert counts["big"] in (2, 3), counts


async def test_running_cap_holds_across_consumers_and_frees_on_finish(
    redis: Redis, queue: JobQueue
) -> None:
    """A tenant capped at 2 never has more than 2 jobs fed and unfinished, whichever worker
    asks; B is served meanwhile; a finish lets the next A job through."""
    capped = TenantPolicy(max_running=2)
    for i in range(6):
        await queue.enqueue(full("A", i), policy=capped)
    for i in range(2):
        await queue.enqueue(full("B", i), policy=capped)
    a = home_partition("A", queue.settings.partitions)
    assert a == 0  # one partition here; the routing is what makes the cap one counter
    first = [t for t in await queue.take(0, {}, 10, "w1") if t.outcome == "started"]
    second = [t for t in await queue.take(0, {}, 10, "w2") if t.outcome == "started"]
    tenants = Counter(t.job.tenant for t in first + second if t.job is not None)
    assert tenants == {"A": 2, "B": 2}
    await complete(queue, [t for t in first + second if t.job and t.job.tenant == "A"][:1])
    third = [t for t in await queue.take(0, {}, 10, "w3") if t.outcome == "started"]
    assert [t.job.tenant for t in third if t.job] == ["A"]


async def test_raising_a_cap_lets_a_parked_tenant_back_in(queue: JobQueue) -> None:
    for i in range(4):
        await queue.enqueue(full("A", i), policy=TenantPolicy(max_running=1))
    got = [t for t in await queue.take(0, {}, 10, "w1") if t.outcome == "started"]
    assert len(got) == 1
    assert [t for t in await queue.take(0, {}, 10, "w1") if t.outcome == "started"] == []
    await queue.enqueue(full("A", 9), policy=TenantPolicy(max_running=3))
    more = [t for t in await queue.take(0, {}, 10, "w1") if t.outcome == "started"]
    assert len(more) == 2


async def test_a_canceled_waiting_job_is_dropped_and_nothing_stays_counted(
    redis: Redis, queue: JobQueue
) -> None:
    ids = [(await queue.enqueue(full("A", i))).job_id for i in range(5)]
    assert await queue.cancel(ids[2]) == "canceled"
    taken: list[Taken] = []
    for _ in range(6):
        taken.extend(await take_one(queue))
    assert [t.job.id for t in taken if t.job] == [ids[0], ids[1], ids[3], ids[4]]
    await complete(queue, taken)
    await assert_bookkeeping_clean(redis, queue)


async def test_a_corrupt_waiting_job_is_dead_lettered_and_the_feed_goes_on(
    redis: Redis, queue: JobQueue
) -> None:
    """A waiting job whose key holds another type (corrupt data) cannot be read: the feed
    moves it to the dead-letter stream instead of failing every take, and serves the rest."""
    ids = [(await queue.enqueue(full("A", i), max_tenant_backlog=10)).job_id for i in range(3)]
    backlog = f"{queue.keys.tag(0)}:backlog:synthesis:A"
    assert await redis.zcard(backlog) == 3  # each counts against the tenant's share
    await redis.delete(queue.keys.job(ids[1]))
    await redis.set(queue.keys.job(ids[1]), "not a hash")
    taken: list[Taken] = []
    for _ in range(4):
        taken.extend(await take_one(queue))
    assert [t.job.id for t in taken if t.job] == [ids[0], ids[2]]
    [letter] = await queue.dead_letters(0)
    assert letter.job_id == ids[1]
    assert letter.reason == "corrupt_job_record"
    assert "WRONGTYPE" in letter.fields["detail"]
    assert await redis.zscore(queue.keys.fair_waiting(0, StreamName.SYNTHESIS), ids[1]) is None
    assert await redis.zscore(backlog, ids[1]) is None  # its share is free again


async def test_overload_counts_waiting_jobs(queue: JobQueue) -> None:
    """The stream's backlog bound counts jobs waiting in tenant queues, not only the stream."""
    for i in range(3):
        assert (await queue.enqueue(full(f"T{i}", i), max_backlog=3)).created
    refused = await queue.enqueue(full("T9"), max_backlog=3)
    assert (refused.overloaded, refused.overload_scope, refused.backlog) == (True, "stream", 3)


async def test_workers_under_load_keep_every_cap_and_leave_no_bookkeeping(
    redis: Redis, queue: JobQueue, start_worker: WorkerFactory
) -> None:
    """Two workers of 6 slots each, tenant A capped at 2 with 12 jobs, B and C uncapped:
    every job completes once, A never runs more than 2 at a time, and the fair-queue
    bookkeeping ends empty."""
    running: Counter[str] = Counter()
    peak: Counter[str] = Counter()

    async def handler(ctx: JobContext) -> JobOutcome:
        tenant = ctx.job.tenant
        running[tenant] += 1
        peak[tenant] = max(peak[tenant], running[tenant])
        try:
            await asyncio.sleep(0.05)
        finally:
            running[tenant] -= 1
        return JobOutcome(artifacts={"result": f"mem://{ctx.job.id}"})

    ids = []
    for i in range(12):
        ids.append((await queue.enqueue(full("A", i), policy=TenantPolicy(max_running=2))).job_id)
        ids.append((await queue.enqueue(full("B", i))).job_id)
        if i % 2:
            ids.append((await queue.enqueue(full("C", i))).job_id)
    await start_worker(handler, worker_concurrency=6, interactive_share=0.0)
    await start_worker(handler, worker_concurrency=6, interactive_share=0.0)
    for job_id in ids:
        job = await wait_for_status(queue, job_id, {"completed"}, timeout=30)
        assert job.attempts == 1
    assert peak["A"] == 2, peak
    assert peak["B"] > 2, peak

    async def clean() -> bool:
        try:
            await assert_bookkeeping_clean(redis, queue)
        except AssertionError:
            return False
        return True

    await eventually(clean, timeout=5)


async def test_one_entry_stays_ready_while_work_waits(redis: Redis, queue: JobQueue) -> None:
    """A worker blocked on the stream (XREADGROUP BLOCK) cannot run the feed, so while jobs
    wait in tenant queues the stream keeps exactly one ready entry -- after enqueues and after
    takes -- and none once nothing waits."""
    stream_key = queue.keys.stream(0, SYN)

    async def ready() -> int:
        pending = await redis.xpending(stream_key, queue.group)
        return int(await redis.xlen(stream_key)) - int(pending["pending"])

    for i in range(4):
        await queue.enqueue(full("A", i))
        assert await ready() == 1
    # an idle worker's blocking read takes the ready entry and moves nothing in...
    assert len(await queue.wait_for_new(0, [SYN], "c2", 10)) == 1
    assert await ready() == 0
    # ...so the next take, which moves one in and reads one, makes one more ready
    for expected_ready in (1, 1, 0):
        assert len(await take_one(queue)) == 1
        assert await ready() == expected_ready
    assert (await queue.waiting(0, SYN)).waiting == 0


async def test_tenant_backlogs_show_waiting_and_capped_running_per_tenant(
    queue: JobQueue,
) -> None:
    for i in range(5):
        await queue.enqueue(full("A", i), policy=TenantPolicy(max_running=2))
    for i in range(3):
        await queue.enqueue(full("B", i))
    await queue.take(0, {}, 3, "w1")
    backlogs = await queue.tenant_backlogs(0, SYN)
    # A: 2 fed under its cap (one of them ready in the stream), 3 waiting; B: whatever the
    # round-robin left waiting, nothing counted (no cap)
    assert backlogs["A"] == (3, 2)
    assert backlogs["B"][1] == 0
    assert sum(w for w, _ in backlogs.values()) == (await queue.waiting(0, SYN)).waiting


async def test_a_mass_redrive_takes_one_share_not_the_front_of_the_line(
    redis: Redis, queue: JobQueue
) -> None:
    """20 dead-lettered jobs of tenant A are redriven; then A and B submit live jobs. The
    redrives wait in A's redrive flow, a tenant of their own in the round-robin: the live jobs
    of both tenants start among the first few, not after all 20 redrives."""
    failed = []
    for i in range(20):
        failed.append((await queue.enqueue(full("A", i))).job_id)
    taken: list[Taken] = []
    while len(taken) < 20:
        taken.extend(t for t in await queue.take(0, {}, 20, "w0") if t.outcome == "started")
    await queue.finish_many(
        [
            Finish(t.job.id, t.entry.stream, t.entry.entry_id, t.token, "failed")
            for t in taken
            if t.job is not None
        ]
    )
    for job_id in failed:
        await redis.xadd(queue.keys.dead_letters(0), {"job": job_id, "reason": "test"})
    for letter in await queue.dead_letters(0):
        assert (await queue.redrive(letter))[0] == "redriven"
    live = {(await queue.enqueue(full(t, 100 + i))).job_id for t in "AB" for i in range(2)}
    first = []
    for _ in range(8):
        first.extend(t.job.id for t in await take_one(queue) if t.job is not None)
    assert live <= set(first), first
    rest = []
    for _ in range(30):
        rest.extend(t.job.id for t in await take_one(queue) if t.job is not None)
    assert set(first + rest) == live | set(failed)
    backlogs = await queue.tenant_backlogs(0, SYN)
    assert backlogs == {}


async def test_a_capped_tenant_waits_for_no_blocking_read_when_its_cap_frees(
    queue: JobQueue, start_worker: WorkerFactory
) -> None:
    """Tenant A capped at 2 with 8 quick jobs and nothing else to do: each commit that frees
    A's cap makes A's next job ready in the stream, so a worker blocked on the stream (idle
    slots on every class) wakes at once, instead of after its blocking read's timeout
    (SPLATQ_FETCH_BLOCK_MS, 3 s here). Before, each pair of jobs waited out one timeout."""
    ids = [
        (await queue.enqueue(full("A", i), policy=TenantPolicy(max_running=2))).job_id
        for i in range(8)
    ]
    loop = asyncio.get_running_loop()
    started = loop.time()
    await start_worker(worker_concurrency=4, interactive_share=0.0, fetch_block_ms=3_000)
    for job_id in ids:
        await wait_for_status(queue, job_id, {"completed"}, timeout=60)
    assert loop.time() - started < 5.0  # before: ~9 s (three blocking reads waited out)


async def test_a_commit_that_frees_a_cap_commits_even_when_the_feed_fails(
    redis: Redis, queue: JobQueue
) -> None:
    """The feed a freed cap triggers is an optimisation (the next take feeds anyway): with
    the tenant's fair queue corrupt (another type under its key, so the feed's LPOP fails),
    the commit still completes the job and emits its event -- the feed's error must not
    stop the commit half-way."""
    capped = TenantPolicy(max_running=1)
    ids = [(await queue.enqueue(full("A", i), policy=capped)).job_id for i in range(2)]
    [first] = await take_one(queue)
    assert first.job is not None
    assert first.job.id == ids[0]
    tenant_queue = queue.keys.fair_queue(0, SYN, "A")
    await redis.delete(tenant_queue)
    await redis.set(tenant_queue, "not a list")
    [(outcome, status)] = await queue.finish_many(
        [Finish(ids[0], first.entry.stream, first.entry.entry_id, first.token, "completed",
                event=EventType.COMPLETED.value)]
    )  # fmt: skip
    assert (outcome, status) == ("ok", "completed")
    job = await queue.get(ids[0])
    assert job is not None
    assert job.status.value == "completed"
    history = await redis.lrange(queue.keys.job(ids[0]) + ":h", 0, -1)  # type: ignore[misc]
    assert any("\tcompleted\t" in item for item in history)
