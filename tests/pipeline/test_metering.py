"""Metering and charging on the staged pipeline (real Redis, the toy stage handlers): each unit
of work is metered once with the time the run that did it measured, whatever faults, cancels
and redrives happen around it, and the quota charges exactly the units the charging policy
says -- the invariant of docs/operations.md#what-is-charged."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.asyncio import Redis

from splatq.services.quota_settler.settler import Settler
from splatq.shared.engine.jobs import JobRecord, JobSpec
from splatq.shared.engine.metering import stage_unit
from splatq.shared.engine.queue import JobQueue
from splatq.shared.engine.stages import PIPELINE, PipelineStage
from splatq.shared.errors import TransientError
from splatq.shared.settings import Settings
from splatq.shared.storage.store import LocalFileStorage
from splatq.shared.tenants.charging import Verdict, verdict_for_status
from splatq.shared.tenants.periods import Period
from splatq.shared.tenants.quota import QuotaBook
from splatq.shared.tenants.store import TenantStore
from splatq.shared.testing import StagesFactory, eventually, wait_for_status
from tests.pipeline.test_pipeline_engine import _redrive, works
from tests.stage_handlers import ToyStages

SLOW_S = 0.25  # every stage's work takes at least this long: its metered time must show it
WORK_STAGES = PIPELINE[:-1]  # publish copies, it makes no unit of its own
PLATFORM = "STORAGE_BROKE"  # a failure code the policy blames on the platform
DEAD_LETTER = frozenset({PLATFORM})


@pytest.fixture
def toy(storage: LocalFileStorage) -> ToyStages:
    return ToyStages(storage)


def spec(**metadata: Any) -> JobSpec:
    slow = {s.value: SLOW_S for s in WORK_STAGES}
    return JobSpec(tenant="acme", quality="preview", metadata={"slow": slow, **metadata})


async def reserved(queue: JobQueue, book: QuotaBook, s: JobSpec) -> str:
    """Enqueue as the gateway does: the job's estimate reserved under its id first."""
    job_id = queue.new_job_id(s)
    assert (await book.reserve("acme", job_id, 60_000)).granted
    assert (await queue.enqueue(s, job_id=job_id)).created
    return job_id


async def drain(settler: Settler) -> None:
    """Apply every event the settler has not handled yet, in every partition."""
    for partition in range(settler.settings.partitions):
        while await settler.step(partition, block_ms=50):
            pass


def assert_measured(job: JobRecord, stages: tuple[PipelineStage, ...]) -> None:
    """One unit per stage that did work, each metered with a real measurement of it."""
    by_stage = {unit.split(".", 1)[0]: ms for unit, ms in job.metered.items()}
    assert set(by_stage) == {s.value for s in stages}, job.metered
    assert len(job.metered) == len(stages), job.metered
    for stage, ms in by_stage.items():
        assert SLOW_S * 1000 <= ms < SLOW_S * 1000 + 20_000, (stage, ms)


async def test_a_failure_after_the_work_is_metered_once_with_the_makers_time(
    queue: JobQueue, redis: Redis, toy: ToyStages, start_stages: StagesFactory
) -> None:
    """reconstruct stored its outputs, then failed before its advance: the retry reuses them,
    and the job is metered exactly like the same job without the fault -- the unit keeps the
    time of the run that did the work, and the ledger record keeps it too (item 2 of #21:
    the reuse used to record 0 ms over it)."""
    await start_stages(toy, "all")
    plain = (await queue.enqueue(spec())).job_id
    faulted = (await queue.enqueue(spec(fail_after_work={"reconstruct": "FLAKY"}))).job_id
    jobs = [
        await wait_for_status(queue, j, {"completed", "failed"}, timeout=60)
        for j in (plain, faulted)
    ]
    for job in jobs:
        assert job.status.value == "completed", job.error
        assert_measured(job, WORK_STAGES)
        assert job.compute_time_ms == sum(job.metered.values())
        record = job.ledger[PipelineStage.RECONSTRUCT]
        assert record.work_ms == job.metered[stage_unit("reconstruct", record.digest)]
    assert jobs[1].ledger[PipelineStage.RECONSTRUCT].skipped  # it was the reuse that advanced
    assert (await works(redis, faulted))["reconstruct"] == 1


async def test_a_run_that_died_before_metering_is_metered_by_the_reuse(
    queue: JobQueue, toy: ToyStages
) -> None:
    """The process died between storing a stage's outputs and metering them: the run that
    reuses the outputs meters the unit with the dead run's own measured time."""
    job = await queue.get((await queue.enqueue(spec())).job_id)
    assert job is not None
    metered: list[tuple[str, int]] = []

    async def work() -> tuple[dict[str, bytes], dict[str, str]]:
        await asyncio.sleep(SLOW_S)
        return {"out": b"x"}, {"n": "1"}

    async def dies(unit: str, ms: int) -> None:
        raise TransientError("the process died here", code="DIED")

    async def records(unit: str, ms: int) -> None:
        metered.append((unit, ms))

    stage = PipelineStage.INGEST
    with pytest.raises(TransientError):
        await toy.store.run_stage(job, stage, "d1", ("out",), work, dies)
    done = await toy.store.run_stage(job, stage, "d1", ("out",), work, records)
    assert done.skipped
    assert done.reused
    assert done.facts == {"n": "1"}  # the marker's time is not a fact for later stages
    [(unit, ms)] = metered
    assert unit == stage_unit("ingest", "d1")
    assert ms >= SLOW_S * 1000


async def test_the_meter_is_fenced_and_safe_to_resend(queue: JobQueue, redis: Redis) -> None:
    job_id = (await queue.enqueue(spec())).job_id
    await redis.hset(queue.keys.job(job_id), "lease_token", "run-1")  # type: ignore[misc]
    assert await queue.meter(job_id, "stale", "ingest.a", 10) == "lease_lost"
    assert await queue.meter(job_id, "run-1", "ingest.a", 10) == "ok"
    assert await queue.meter(job_id, "run-1", "ingest.a", 99) == "already"  # a resend / reuse
    job = await queue.get(job_id)
    assert job is not None
    assert job.metered == {"ingest.a": 10}


@pytest.mark.parametrize("stage", WORK_STAGES)
async def test_a_cancel_during_a_stage_meters_the_work_it_let_finish(
    stage: PipelineStage,
    queue: JobQueue,
    redis: Redis,
    settings: Settings,
    toy: ToyStages,
    start_stages: StagesFactory,
) -> None:
    """A cancel lands at the next stage boundary: the running stage finishes its work, which
    is metered, and the canceled job is charged every unit it holds (item 1 of #21)."""
    book = QuotaBook(redis)
    await start_stages(toy, "all")
    slow = {s.value: SLOW_S for s in WORK_STAGES}
    slow[stage.value] = 1.0
    job_id = await reserved(queue, book, spec(slow=slow))

    async def running_there() -> bool:
        job = await queue.get(job_id)
        return job is not None and job.current_stage == stage.value and job.status == "processing"

    await eventually(running_there, timeout=60)
    assert await queue.cancel(job_id, "acme") == "cancel_requested"
    job = await wait_for_status(queue, job_id, {"canceled", "completed", "failed"}, timeout=60)
    assert job.status.value == "canceled"
    done = PIPELINE[: PIPELINE.index(stage) + 1]
    assert_measured(job, done)
    settler = Settler(queue, book, consumer="test")
    await settler.setup()
    await drain(settler)
    assert await book.charged_units("acme", job_id) == dict(job.metered)
    usage = await book.usage("acme")
    assert (usage.reserved_ms, usage.used_ms) == (0, sum(job.metered.values()))


async def test_a_redrive_from_a_stage_discards_the_units_it_runs_again(
    queue: JobQueue, redis: Redis, settings: Settings, toy: ToyStages, start_stages: StagesFactory
) -> None:
    await start_stages(toy, "all", dead_letter_codes=DEAD_LETTER)
    q = JobQueue(redis, settings.with_overrides(dead_letter_codes=DEAD_LETTER))
    job_id = (await q.enqueue(spec(fail={"publish": PLATFORM}))).job_id
    failed = await wait_for_status(q, job_id, {"failed"}, timeout=60)
    assert_measured(failed, WORK_STAGES)
    assert (await _redrive(q, job_id, PipelineStage.RECONSTRUCT))[0] == "redriven"
    job = await wait_for_status(q, job_id, {"completed", "failed"}, timeout=60)
    assert job.status.value == "completed", job.error
    assert_measured(job, WORK_STAGES)  # one unit per stage: the rerun's, not both
    assert job.metered[stage_unit("ingest", job.ledger[PipelineStage.INGEST].digest)]
    kept = {u for u in failed.metered if u.startswith("ingest.")}
    assert set(failed.metered) & set(job.metered) == kept


async def test_the_charged_total_is_the_metered_work_that_counted_for_every_job(
    queue: JobQueue, redis: Redis, settings: Settings, toy: ToyStages, start_stages: StagesFactory
) -> None:
    """The invariant (item 4 of #21), over jobs that meet every fault the engine handles in
    process: a plain run; a transient failure after the work at every stage; a failure the
    input causes (charged) and one the platform causes (waived); a platform failure at
    publish redriven as it is (the reused work is charged when the result uses it) and with
    --from-stage (the discarded work is never charged); a cancel while queued. For every job
    the ledger charged exactly its metered units when its end is charged and nothing when it
    is waived, each unit once; the tenant's usage is their sum; and no job that did any work
    lacks a reservation. (SIGKILLs and lease losses: tests/system/test_pipeline_crash.py.)"""
    book = QuotaBook(redis)
    await TenantStore(redis).set_quota("acme", 10_000, Period.DAY)
    await start_stages(toy, "all", dead_letter_codes=DEAD_LETTER)
    q = JobQueue(redis, settings.with_overrides(dead_letter_codes=DEAD_LETTER))
    after_work = {s.value: "FLAKY" for s in WORK_STAGES}
    jobs = [
        await reserved(q, book, spec()),
        await reserved(q, book, spec(fail_after_work=after_work)),
        await reserved(q, book, spec(fail={"export": "INVALID_IMAGE"})),
        await reserved(q, book, spec(fail={"render": "UNEXPECTED_ERROR"})),
    ]
    resumed = await reserved(q, book, spec(fail={"publish": PLATFORM}))
    rerun = await reserved(q, book, spec(fail={"publish": PLATFORM}))
    queued = await reserved(q, book, spec())
    await q.cancel(queued, "acme")  # (it may have started already: then it is canceled there)
    settler = Settler(q, book, consumer="test")
    await settler.setup()
    for job_id in (resumed, rerun):
        await wait_for_status(q, job_id, {"failed"}, timeout=60)
        await drain(settler)  # the waived failure is settled first
        assert await book.charged_units("acme", job_id) == {}
    assert (await _redrive(q, resumed))[0] == "redriven"
    assert (await _redrive(q, rerun, PipelineStage.EXPORT))[0] == "redriven"
    ended = [
        await wait_for_status(q, j, {"completed", "failed", "canceled"}, timeout=60)
        for j in [*jobs, resumed, rerun, queued]
    ]
    await drain(settler)
    assert await settler.sweep(grace_s=0) == 0  # the events said everything
    charged_total = 0
    for job in ended:
        decided = verdict_for_status(
            job.status.value,
            job.error.code if job.error else "",
            settings.quota_charged_failure_codes,
        )
        assert decided is not None
        charged = await book.charged_units("acme", job.id)
        expected = dict(job.metered) if decided[0] is Verdict.CHARGE else {}
        assert charged == expected, (job.id, job.status, job.error)
        charged_total += sum(charged.values())
        ledger = await book.ledger("acme", job.id)
        assert "reserve" in ledger  # nothing ran without a reservation
        assert job.id not in await book.open_reservations("acme")
    by_id = {job.id: job for job in ended}
    assert [by_id[j].status.value for j in jobs] == ["completed", "completed", "failed", "failed"]
    for job_id in (jobs[0], jobs[1], resumed, rerun):
        assert_measured(by_id[job_id], WORK_STAGES)
    assert_measured(by_id[jobs[2]], PIPELINE[:2])  # charged: the input's fault
    usage = await book.usage("acme")
    assert (usage.reserved_ms, usage.used_ms) == (0, charged_total)
    assert await works(redis, resumed) == dict.fromkeys((s.value for s in PIPELINE), 1)
