"""The staged pipeline's engine on real Redis with small stage handlers (tests/stage_handlers):
advance, the ledger, content-addressed reuse, redrive from a stage, cancel between stages,
backpressure between stages, the class guarantee inside a stage, and the fence."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
import structlog
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from redis.asyncio import Redis

from splatq.shared.engine.fairness import TenantPolicy
from splatq.shared.engine.ids import partition_of
from splatq.shared.engine.jobs import JobSpec
from splatq.shared.engine.keys import StreamName
from splatq.shared.engine.metering import UNIT_DIGEST_CHARS
from splatq.shared.engine.queue import Advance, JobQueue
from splatq.shared.engine.scripts import Script, ScriptCall
from splatq.shared.engine.stages import PIPELINE, PipelineStage, StageStatus
from splatq.shared.maintenance.audit import AuditAction, AuditRecord
from splatq.shared.maintenance.deadletters import DeadLetterBook
from splatq.shared.maintenance.keys import DeadLetterKind
from splatq.shared.redis.client import connect
from splatq.shared.redis.server import RedisServer, free_port
from splatq.shared.settings import Settings
from splatq.shared.storage.store import LocalFileStorage
from splatq.shared.testing import StagesFactory, engine_settings, eventually, wait_for_status
from tests.fault_fixtures import own_server, proxied, proxy, sha  # noqa: F401 - fixtures
from tests.faultproxy import FaultProxy
from tests.stage_handlers import ToyStages, expected_result, work_key
from tests.tracing_fixtures import spans  # noqa: F401 - the fixture


@pytest.fixture
def toy(storage: LocalFileStorage) -> ToyStages:
    return ToyStages(storage)


def staged_spec(quality: str = "preview", **metadata: object) -> JobSpec:
    return JobSpec(tenant="acme", quality=quality, metadata=metadata)


async def works(redis: Redis, job_id: str) -> dict[str, int]:
    """How many times each stage's work really ran for the job."""
    out = {}
    for stage in PIPELINE:
        raw = await redis.get(work_key(job_id, stage.value))
        out[stage.value] = int(raw or 0)
    return out


async def test_every_stage_runs_once_in_order_and_publish_completes(
    queue: JobQueue, redis: Redis, toy: ToyStages, start_stages: StagesFactory
) -> None:
    job_id = (await queue.enqueue(staged_spec())).job_id
    await start_stages(toy, "ingest,reconstruct,export,render,publish")
    job = await wait_for_status(queue, job_id, {"completed", "failed"})
    assert job.status.value == "completed", job.error
    assert job.artifacts == {"result": expected_result(job_id)}
    assert await works(redis, job_id) == dict.fromkeys((s.value for s in PIPELINE), 1)
    for stage in PIPELINE[:-1]:
        assert job.ledger[stage].status is StageStatus.SUCCEEDED
        assert job.ledger[stage].attempts == 1
    # The entry streams and every stage stream are empty again (acked entries are deleted).
    for stage in PIPELINE:
        for s in StreamName:
            assert await redis.xlen(queue.for_stage(stage).keys.stream(0, s)) == 0

    async def cleaned() -> bool:
        j = await queue.get(job_id)
        return j is not None and PipelineStage.CLEANUP in j.ledger

    before = job.ledger
    assert any(before[s].outputs for s in PIPELINE[:-1])
    await start_stages(toy, "cleanup")
    await eventually(cleaned)
    assert await toy.store.delete_job(job_id) == 0  # nothing left to delete
    # The records no longer name the deleted outputs and keep everything else: what the API's
    # stage view reads, and of the digest what ties each to its metered unit.
    after = (await queue.get(job_id)).ledger  # type: ignore[union-attr]
    for stage in PIPELINE[:-1]:
        digest = before[stage].digest[:UNIT_DIGEST_CHARS]
        assert after[stage] == replace(before[stage], outputs={}, digest=digest)
    # A resend of the cleanup's commit (a lost reply) changes no record again.
    key = queue.keys.job(job_id)
    recorded = await redis.hgetall(key)
    cleanup_stream = queue.for_stage(PipelineStage.CLEANUP).keys.stream(0, StreamName.INTERACTIVE)
    await queue.scripts.run(
        ScriptCall(
            Script.CLEANUP_DONE,
            [key, cleanup_stream],
            [queue.group, "0-1", recorded["ps.cleanup"], UNIT_DIGEST_CHARS],
        )
    )
    assert await redis.hgetall(key) == recorded


async def test_a_failure_after_the_work_reuses_its_outputs_on_retry(
    queue: JobQueue, redis: Redis, toy: ToyStages, start_stages: StagesFactory
) -> None:
    """export wrote its outputs, then failed before its commit: the retried export reuses
    them (no second work), and reconstruct -- already committed -- never runs again."""
    job_id = (await queue.enqueue(staged_spec(fail_after_work={"export": "FLAKY"}))).job_id
    await start_stages(toy, "all")
    job = await wait_for_status(queue, job_id, {"completed", "failed"})
    assert job.status.value == "completed", job.error
    assert job.artifacts == {"result": expected_result(job_id)}
    assert job.ledger[PipelineStage.EXPORT].attempts == 2
    assert job.ledger[PipelineStage.EXPORT].skipped  # the second run found the outputs
    assert await works(redis, job_id) == dict.fromkeys((s.value for s in PIPELINE), 1)


async def _dead_letter_of(book: DeadLetterBook, job_id: str) -> object:
    letters = [x for x in await book.page(DeadLetterKind.JOBS, 0, "", 100) if x.job_id == job_id]
    assert len(letters) == 1
    return letters[0]


async def _redrive(
    queue: JobQueue, job_id: str, from_stage: PipelineStage | None = None
) -> tuple[str, str]:
    book = DeadLetterBook(queue)
    letter = await _dead_letter_of(book, job_id)
    [subject] = await book.subjects(DeadLetterKind.JOBS, [letter])  # type: ignore[list-item]
    record = AuditRecord(AuditAction.REDRIVEN, "test", "jobs", "person:test", "")
    call = book.redrive_call(subject, record, from_stage=from_stage)
    [outcome] = await book.redrive_many([(subject, call)])
    return outcome


async def test_a_redrive_resumes_at_the_failed_stage_and_from_stage_runs_again(
    queue: JobQueue,
    redis: Redis,
    settings: Settings,
    toy: ToyStages,
    start_stages: StagesFactory,
) -> None:
    await start_stages(toy, "all", dead_letter_codes=frozenset({"RENDER_BROKE", "PUBLISH_BROKE"}))
    q = JobQueue(redis, settings.with_overrides(dead_letter_codes=frozenset({"RENDER_BROKE"})))
    job_id = (await q.enqueue(staged_spec(fail={"render": "RENDER_BROKE"}))).job_id
    job = await wait_for_status(q, job_id, {"failed"})
    assert job.current_stage == "render"
    assert job.stage == "dead_lettered"
    assert set(job.ledger) == {
        PipelineStage.INGEST,
        PipelineStage.RECONSTRUCT,
        PipelineStage.EXPORT,
    }
    before = await works(redis, job_id)
    assert before == {"ingest": 1, "reconstruct": 1, "export": 1, "render": 0, "publish": 0}

    # default: resume -- the stages that succeeded are skipped by their ledger records
    assert (await _redrive(q, job_id))[0] == "redriven"
    job = await wait_for_status(q, job_id, {"completed", "failed"})
    assert job.status.value == "completed", job.error
    assert job.artifacts == {"result": expected_result(job_id)}
    after = await works(redis, job_id)
    assert after == {"ingest": 1, "reconstruct": 1, "export": 1, "render": 1, "publish": 1}
    assert job.ledger[PipelineStage.INGEST].skipped

    # --from-stage reconstruct: reconstruct and every later stage run again
    other = (
        await q.enqueue(staged_spec(fail={"publish": "RENDER_BROKE"}))
    ).job_id  # dead-lettered at publish
    await wait_for_status(q, other, {"failed"})
    assert (await _redrive(q, other, PipelineStage.RECONSTRUCT))[0] == "redriven"
    job = await wait_for_status(q, other, {"completed", "failed"})
    assert job.status.value == "completed", job.error
    assert await works(redis, other) == {
        "ingest": 1,
        "reconstruct": 2,
        "export": 2,
        "render": 2,
        "publish": 1,  # the failed publish raised before its work
    }


async def test_a_cancel_between_stages_ends_the_job_and_cleans_its_intermediates(
    queue: JobQueue, redis: Redis, toy: ToyStages, start_stages: StagesFactory
) -> None:
    """The job waits on the reconstruct stream (no reconstruct worker yet): a cancel ends it
    at once, its later stage entry is dropped, and its intermediates are cleaned up."""
    await start_stages(toy, "ingest,cleanup")
    job_id = (await queue.enqueue(staged_spec())).job_id

    async def in_reconstruct() -> bool:
        job = await queue.get(job_id)
        return job is not None and job.current_stage == "reconstruct"

    await eventually(in_reconstruct)
    assert await toy.store.all_exist(
        (await queue.get(job_id)).ledger[PipelineStage.INGEST].outputs.values()  # type: ignore[union-attr]
    )
    assert await queue.cancel(job_id) == "canceled"

    async def cleaned() -> bool:
        j = await queue.get(job_id)
        return j is not None and PipelineStage.CLEANUP in j.ledger

    await eventually(cleaned)
    assert await toy.store.delete_job(job_id) == 0
    await start_stages(toy, "reconstruct,export,render,publish")
    stream = queue.for_stage(PipelineStage.RECONSTRUCT).keys.stream(0, StreamName.INTERACTIVE)

    async def dropped() -> bool:
        return int(await redis.xlen(stream)) == 0

    await eventually(dropped)
    job = await queue.get(job_id)
    assert job is not None
    assert job.status.value == "canceled"
    assert await works(redis, job_id) == {
        "ingest": 1,
        "reconstruct": 0,
        "export": 0,
        "render": 0,
        "publish": 0,
    }


async def test_backpressure_keeps_work_in_the_fair_queues_while_the_next_stage_is_full(
    queue: JobQueue, redis: Redis, toy: ToyStages, start_stages: StagesFactory
) -> None:
    """With room for 2 entries per class in the reconstruct stream and no reconstruct worker,
    ingest moves 2 jobs on and leaves the rest waiting in fair order; once reconstruct runs,
    everything completes."""
    ids = [(await queue.enqueue(staged_spec(n=i))).job_id for i in range(6)]
    await start_stages(toy, "ingest", stage_buffer=2)
    recon = queue.for_stage(PipelineStage.RECONSTRUCT).keys.stream(0, StreamName.INTERACTIVE)

    async def two_moved() -> bool:
        return int(await redis.xlen(recon)) == 2

    await eventually(two_moved)
    await asyncio.sleep(0.5)  # several more fetch rounds of the ingest worker
    assert await redis.xlen(recon) == 2
    waiting = await queue.waiting(0, StreamName.INTERACTIVE)
    assert waiting.waiting + waiting.in_stream == 4
    await start_stages(toy, "reconstruct,export,render,publish", stage_buffer=2)
    for job_id in ids:
        job = await wait_for_status(queue, job_id, {"completed", "failed"})
        assert job.status.value == "completed", job.error


async def test_a_preview_job_does_not_wait_behind_a_synthesis_flood_inside_a_stage(
    queue: JobQueue, redis: Redis, toy: ToyStages, start_stages: StagesFactory
) -> None:
    """A slow reconstruct stage saturated by full jobs still starts a preview job at once:
    every stage has its own interactive stream and reserved slots."""
    slow = {"reconstruct": 1.0}
    full = [(await queue.enqueue(staged_spec("full", slow=slow))).job_id for _ in range(6)]
    await start_stages(toy, "all", worker_concurrency=3, interactive_share=0.34)

    async def flood_running() -> bool:
        jobs = [await queue.get(j) for j in full]
        return sum(j is not None and j.current_stage == "reconstruct" for j in jobs) >= 2

    await eventually(flood_running)
    preview = (await queue.enqueue(staged_spec())).job_id
    job = await wait_for_status(queue, preview, {"completed"}, timeout=10)
    full_done = [await queue.get(j) for j in full]
    assert sum(j is not None and j.status.value == "completed" for j in full_done) < len(full)
    assert job.ledger[PipelineStage.RECONSTRUCT].status is StageStatus.SUCCEEDED


async def test_an_advance_is_fenced_and_safe_to_resend(queue: JobQueue, redis: Redis) -> None:
    """A run that does not hold the job advances nothing; the holder's advance moves the job
    once, and a resend of that very call (a lost reply) answers ok without a second entry."""
    job_id = (await queue.enqueue(staged_spec())).job_id
    ingest = queue.for_stage(PipelineStage.INGEST)
    [taken] = await ingest.take(0, {StreamName.INTERACTIVE: 1}, 0, "c1")
    assert taken.job is not None
    assert taken.job.current_stage == "ingest"

    def advance(token: str, request_id: str = "") -> Advance:
        kw = {"request_id": request_id} if request_id else {}
        return Advance(
            job_id=job_id,
            stream=StreamName.INTERACTIVE,
            entry_id=taken.entry.entry_id,
            token=token,
            stage="ingest",
            next_stage="reconstruct",
            record='{"status":"succeeded","attempts":1}',
            progress=0.2,
            event_extra='"stage":"ingest"',
            **kw,
        )

    assert await ingest.advance(advance("not-the-token")) == ("lease_lost", "")
    good = advance(taken.token, request_id="req-1")
    status, entry = await ingest.advance(good)
    assert status == "ok"
    assert entry
    assert await ingest.advance(good) == ("ok", entry)
    recon = queue.for_stage(PipelineStage.RECONSTRUCT).keys.stream(0, StreamName.INTERACTIVE)
    assert await redis.xlen(recon) == 1
    job = await queue.get(job_id)
    assert job is not None
    assert (job.status.value, job.current_stage, job.attempts) == ("queued", "reconstruct", 0)
    assert job.ledger[PipelineStage.INGEST].status is StageStatus.SUCCEEDED
    # the lease is gone and the ingest entry acked and deleted
    assert await redis.exists(queue.keys.lease(job_id)) == 0
    assert await redis.xlen(queue.keys.stream(partition_of(job_id), StreamName.INTERACTIVE)) == 0


async def test_an_advance_whose_reply_is_lost_moves_the_job_once(
    proxied: JobQueue,  # noqa: F811
    proxy: FaultProxy,  # noqa: F811
    redis: Redis,
    toy: ToyStages,
    settings: Settings,
) -> None:
    """Through the fault proxy: the advance ran but its reply was lost; the worker resends
    the same call and the job reaches the next stage once, then completes."""
    from splatq.shared.engine.worker import Worker  # noqa: PLC0415

    job_id = (await proxied.enqueue(staged_spec())).job_id
    proxy.lose_reply_after(sha(proxied, Script.ADVANCE))
    stages = [
        Worker(proxied.for_stage(s), settings.for_stage(s.value), toy.handler(s)) for s in PIPELINE
    ]
    tasks = [asyncio.create_task(w.run()) for w in stages]
    try:
        job = await wait_for_status(proxied, job_id, {"completed", "failed"}, timeout=20)
    finally:
        for w in stages:
            w.stop()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert proxy.lost_replies == 1
    assert job.status.value == "completed", job.error
    assert await works(redis, job_id) == dict.fromkeys((s.value for s in PIPELINE), 1)
    assert all(job.ledger[s].attempts == 1 for s in PIPELINE[:-1])


async def test_every_stage_run_is_a_span_of_the_jobs_trace(
    spans: InMemorySpanExporter,  # noqa: F811 - the imported fixture
    queue: JobQueue,
    redis: Redis,
    settings: Settings,
    toy: ToyStages,
) -> None:
    from splatq.shared.engine.runner import traced  # noqa: PLC0415
    from splatq.shared.engine.worker import Worker  # noqa: PLC0415

    job = await queue.enqueue(staged_spec())
    workers = [
        Worker(queue.for_stage(s), settings.for_stage(s.value), traced(toy.handler(s), s.value))
        for s in PIPELINE
    ]
    tasks = [asyncio.create_task(w.run()) for w in workers]
    try:
        done = await wait_for_status(queue, job.job_id, {"completed", "failed"})
    finally:
        for w in workers:
            w.stop()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert done.status.value == "completed", done.error
    runs = [s for s in spans.get_finished_spans() if s.name.startswith("stage.")]
    assert sorted(s.name for s in runs) == sorted(f"stage.{s.value}" for s in PIPELINE)
    assert {s.context.trace_id for s in runs} == {int(done.trace_id, 16)}
    assert {s.attributes["splatq.stage"] for s in runs if s.attributes} == {
        s.value for s in PIPELINE
    }


async def test_an_announcement_is_fenced_and_sent_once(queue: JobQueue, redis: Redis) -> None:
    job_id = (await queue.enqueue(staged_spec())).job_id
    ingest = queue.for_stage(PipelineStage.INGEST)
    [taken] = await ingest.take(0, {StreamName.INTERACTIVE: 1}, 0, "c1")
    event = "3d_reconstruction.preview_ready"
    assert await queue.announce(job_id, "not-the-token", event, '"x":1') == "lease_lost"
    assert await queue.announce(job_id, taken.token, event, '"x":1', {"quick_run": "q1"}) == "ok"
    assert await queue.announce(job_id, taken.token, event, '"x":2') == "already"
    sent = [f for _, f in await redis.xrange(queue.keys.events(0)) if f["type"] == event]
    assert len(sent) == 1
    assert '"x":1' in sent[0]["payload"]
    job = await queue.get(job_id)
    assert job is not None
    assert job.quick_run == "q1"


async def test_a_stage_past_its_timeout_is_retried_within_its_own_attempts_then_fails(
    queue: JobQueue, redis: Redis, toy: ToyStages, start_stages: StagesFactory
) -> None:
    """export has 1 s per run and 2 attempts of its own (other stages keep theirs): a run
    that takes 3 s ends as a retryable TIMEOUT, and the job fails in export after two."""
    job_id = (await queue.enqueue(staged_spec(slow={"export": 3}))).job_id
    await start_stages(
        toy,
        "all",
        stage_timeout_s={"export": 1},
        stage_max_attempts={"export": 2},
        max_attempts=5,
    )
    job = await wait_for_status(queue, job_id, {"completed", "failed"}, timeout=20)
    assert job.status.value == "failed"
    assert job.error is not None
    assert job.error.code == "TIMEOUT"
    assert "export stage ran past its 1 s timeout" in job.error.message
    assert (job.current_stage, job.attempts) == ("export", 2)
    assert job.ledger[PipelineStage.RECONSTRUCT].attempts == 1


@pytest.mark.parametrize("how", ["oom", "readonly"])
async def test_an_advance_refused_by_an_error_reply_changes_nothing_and_the_resend_moves_it(
    own_server: RedisServer,  # noqa: F811
    how: str,
) -> None:
    """OOM (maxmemory reached) or READONLY (a replica mid-failover): the advance answers
    'transient' and writes nothing -- no next-stage entry, the job still processing under
    its lease -- and the same call, resent once Redis accepts writes, moves the job once."""
    from tests.shared.test_faults import _accept_writes, _refuse_writes  # noqa: PLC0415

    s = engine_settings(own_server.url)
    client = connect(own_server.url)
    try:
        queue = JobQueue(client, s)
        await queue.setup()
        job_id = (await queue.enqueue(staged_spec())).job_id
        ingest = queue.for_stage(PipelineStage.INGEST)
        [taken] = await ingest.take(0, {StreamName.INTERACTIVE: 1}, 0, "c1")
        request = Advance(
            job_id=job_id,
            stream=StreamName.INTERACTIVE,
            entry_id=taken.entry.entry_id,
            token=taken.token,
            stage="ingest",
            next_stage="reconstruct",
            record='{"status":"succeeded","attempts":1}',
            progress=0.2,
            event_extra='"stage":"ingest"',
        )
        recon = queue.for_stage(PipelineStage.RECONSTRUCT).keys.stream(0, StreamName.INTERACTIVE)
        await _refuse_writes(client, how, free_port())
        try:
            outcome, _ = await ingest.advance(request)
            assert outcome == "transient"
            assert await client.exists(recon) == 0
            job = await queue.get(job_id)
            assert job is not None
            assert (job.status.value, job.current_stage) == ("processing", "ingest")
        finally:
            await _accept_writes(client, how)
        assert (await ingest.advance(request))[0] == "ok"
        assert (await ingest.advance(request))[0] == "ok"  # a resend of that call
        assert await client.xlen(recon) == 1
    finally:
        await client.aclose()


@pytest.mark.parametrize("buffer", [2, 0], ids=["backpressure", "no-bound"])
async def test_a_tenants_flood_does_not_put_another_tenant_behind_it_in_later_stages(
    queue: JobQueue, redis: Redis, toy: ToyStages, start_stages: StagesFactory, buffer: int
) -> None:
    """Tenant A floods 10 full jobs into a slow reconstruct stage (one slot, 0.3 s a job).
    With a stage buffer of 2 the flood waits in A's fair queue, not in the reconstruct
    stream, so tenant B's one job, submitted after it, passes most of A's: ahead of it are
    at most the one running, the 2 buffered, the entry stream's one ready entry and A's turn
    in the round-robin (plus one that may have finished meanwhile). Without the bound
    (buffer 0) ingest drains the flood into the reconstruct stream first and B comes (about)
    last: the case the bound exists for. (Full jobs: the round-robin's quantum is one full
    job's cost, so previews would take turns ten at a time.)"""
    slow = {"reconstruct": 0.3}
    flood = [
        (await queue.enqueue(JobSpec(tenant="A", quality="full", metadata={"slow": slow})))
        for _ in range(10)
    ]
    await start_stages(toy, "all", stage_buffer=buffer, stage_concurrency={"reconstruct": 1})

    async def flood_started() -> bool:
        j = await queue.get(flood[0].job_id)
        return j is not None and j.current_stage not in ("", "ingest")

    await eventually(flood_started)
    b = await queue.enqueue(JobSpec(tenant="B", quality="full", metadata={"slow": slow}))
    await wait_for_status(queue, b.job_id, {"completed"}, timeout=15)
    done = [await queue.get(r.job_id) for r in flood]
    finished = sum(j is not None and j.status.value == "completed" for j in done)
    if buffer:
        assert finished <= 6, finished
    else:
        assert finished >= 8, finished  # all, or all but the one or two ingest was running
    for r in flood:
        await wait_for_status(queue, r.job_id, {"completed"}, timeout=15)


async def test_a_capped_tenants_next_job_enters_the_pipeline_when_its_last_stage_commits(
    queue: JobQueue, toy: ToyStages, start_stages: StagesFactory
) -> None:
    """Tenant A capped at one job at a time, four previews, every stage running in one
    process with a 3 s blocking read: the commit that ends a job in its last stage frees the
    cap and makes A's next job ready in the entry stream, so the idle ingest worker starts
    it at once. Before, each next job waited out the ingest worker's blocking read (over 9 s
    for four)."""
    capped = TenantPolicy(max_running=1)
    ids = [(await queue.enqueue(staged_spec(n=i), policy=capped)).job_id for i in range(4)]
    loop = asyncio.get_running_loop()
    started = loop.time()
    await start_stages(toy, "all", fetch_block_ms=3_000)
    for job_id in ids:
        job = await wait_for_status(queue, job_id, {"completed", "failed"}, timeout=60)
        assert job.status.value == "completed", job.error
    assert loop.time() - started < 7.5  # before: ~9 s (three blocking reads waited out)


async def test_a_stage_buffer_below_the_stages_slots_is_said_at_start(
    toy: ToyStages, start_stages: StagesFactory
) -> None:
    """SPLATQ_STAGE_BUFFER counts a stage's own running jobs, so a stage with more slots than
    the buffer can never fill them: each such stage worker says so once as it starts (with
    a next stage to hold it back; publish, the last, has none)."""
    with structlog.testing.capture_logs() as logs:
        await start_stages(toy, "ingest,render,publish", stage_buffer=4, worker_concurrency=8)

        async def all_started() -> bool:
            return sum(e["event"] == "worker.started" for e in logs) == 3

        await eventually(all_started)
    warned = [e for e in logs if e["event"] == "stage.buffer_below_slots"]
    assert sorted((e["stage"], e["slots"], e["stage_buffer"]) for e in warned) == [
        ("ingest", 8, 4),
        ("render", 8, 4),
    ]
    assert all(e["log_level"] == "warning" for e in warned)
