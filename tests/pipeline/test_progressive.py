"""Progressive results through the staged pipeline on CPU (real Redis, one worker per stage,
local storage, the builtin model at small resolutions): a full job submitted with
`progressive` gets its quick preview-resolution result, announced once by `preview_ready`
with the reconstruct stage's advance, before `completed`; a retried reconstruct and a resent
advance announce it once; a plain full job and a preview job announce nothing; webhooks
deliver it to whoever subscribed, and it ends nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
import pytest
import torch
from prometheus_client import CollectorRegistry
from redis.asyncio import Redis

from splatq.services.gpu_worker import formats
from splatq.services.gpu_worker.builtin_model import SilhouetteInflationModel
from splatq.services.gpu_worker.gaussians import Gaussians
from splatq.services.gpu_worker.handler import GpuJobHandler
from splatq.services.gpu_worker.metrics import GpuMetrics
from splatq.services.gpu_worker.stages import QUICK_IMAGE, StageHandlers
from splatq.services.webhook_dispatcher.dispatcher import Dispatcher
from splatq.services.webhook_dispatcher.policy import endpoint_wants, should_deliver
from splatq.shared.client.types import Event
from splatq.shared.engine.events import TERMINAL_EVENTS, EventType
from splatq.shared.engine.ids import partition_of
from splatq.shared.engine.job_context import JobContext, JobHandler
from splatq.shared.engine.jobs import JobRecord, JobSpec
from splatq.shared.engine.keys import StreamName
from splatq.shared.engine.queue import Advance, JobQueue
from splatq.shared.engine.stages import PipelineStage
from splatq.shared.errors import PermanentError, TransientError
from splatq.shared.settings import Settings
from splatq.shared.storage.store import (
    ARTIFACT_FILES,
    LocalFileStorage,
    artifact_key,
    is_quick_run,
)
from splatq.shared.testing import StagesFactory, eventually, job_events, wait_for_status
from splatq.shared.webhooks.endpoints import EndpointStore
from splatq.shared.webhooks.store import WebhookStore
from tests.gpu_worker.conftest import stored_spec
from tests.webhook_dispatcher.conftest import (  # noqa: F401 - fixtures
    ReceiverFactory,
    dispatcher_settings,
    receivers,
    start_dispatcher,
)

PREVIEW_READY = EventType.PREVIEW_READY.value
COMPLETED = EventType.COMPLETED.value
SMALL = {"preview": 48, "full": 96}


class SmallModel(SilhouetteInflationModel):
    """The builtin model at small input resolutions (a CPU test's budget); the same code."""

    def input_resolution(self, quality: str) -> int:
        return SMALL[quality]


def make_stage_handlers(
    settings: Settings, storage: LocalFileStorage, model: SmallModel | None = None
) -> StageHandlers:
    gpu = GpuJobHandler(
        settings.with_overrides(device="cpu"),
        model or SmallModel(),
        storage,
        GpuMetrics.create(CollectorRegistry()),
    )
    return StageHandlers(gpu)


@pytest.fixture
async def stage_handlers(
    settings: Settings, storage: LocalFileStorage
) -> AsyncIterator[StageHandlers]:
    h = make_stage_handlers(settings, storage)
    await h.startup(tuple(PipelineStage))
    yield h
    await h.shutdown()


def sample() -> bytes:
    from tests.gpu_worker.conftest import sample_png  # noqa: PLC0415

    return sample_png(5)


async def progressive_spec(storage: LocalFileStorage, progressive: bool = True) -> JobSpec:
    spec = await stored_spec(storage, sample(), quality="full")
    return JobSpec(
        tenant=spec.tenant,
        quality="full",
        params={"quality": "full", "progressive": True} if progressive else {},
        input_ref=spec.input_ref,
        input_sha256=spec.input_sha256,
    )


async def payloads(redis: Redis, queue: JobQueue, job_id: str) -> list[tuple[str, Any]]:
    """(event type, payload) of one job's events, in order."""
    entries = await redis.xrange(queue.keys.events(partition_of(job_id)))
    return [
        (f["type"], orjson.loads(f["payload"])) for _, f in entries if f.get("job_id") == job_id
    ]


async def cleaned(queue: JobQueue, job_id: str) -> None:
    async def done() -> bool:
        j = await queue.get(job_id)
        return j is not None and PipelineStage.CLEANUP in j.ledger

    await eventually(done, timeout=20)


def quick_files(storage: LocalFileStorage, job: JobRecord) -> dict[str, bytes]:
    run = job.ledger[PipelineStage.RECONSTRUCT].facts["quick_run"]
    assert is_quick_run(run)
    return {
        name: storage.path_of(artifact_key(job.id, f, run)).read_bytes()
        for name, f in ARTIFACT_FILES.items()
    }


async def test_a_progressive_job_announces_its_quick_result_once_before_completed(
    queue: JobQueue,
    redis: Redis,
    storage: LocalFileStorage,
    stage_handlers: StageHandlers,
    start_stages: StagesFactory,
) -> None:
    job_id = (await queue.enqueue(await progressive_spec(storage))).job_id
    # no cleanup stage: the ledger's outputs are read below (cleanup drops them with the files)
    await start_stages(stage_handlers, "ingest,reconstruct,export,render,publish")
    job = await wait_for_status(queue, job_id, {"completed", "failed"}, timeout=60)
    assert job.status.value == "completed", job.error

    events = await payloads(redis, queue, job_id)
    names = [t for t, _ in events]
    assert names.count(PREVIEW_READY) == 1
    assert names.index(PREVIEW_READY) < names.index(COMPLETED)
    # it goes out from inside the reconstruct stage's run, as soon as the quick result is
    # committed: after that stage's `running` progress, before its `succeeded` one
    at = names.index(PREVIEW_READY)
    stage_events = [(p["data"].get("stage"), p["data"].get("stage_status")) for _, p in events]
    assert stage_events.index(("reconstruct", "running")) < at
    assert at < stage_events.index(("reconstruct", "succeeded"))
    assert job.quick_run == job.ledger[PipelineStage.RECONSTRUCT].facts["quick_run"]
    data = events[at][1]["data"]
    assert data["job_id"] == job_id
    assert data["resolution"] == SMALL["preview"]
    assert data["model"] == stage_handlers.model.version
    assert data["compute_time_ms"] >= 0
    assert set(data["artifacts"]) == set(ARTIFACT_FILES)
    for name, url in data["artifacts"].items():
        assert url.endswith(f"/v1/jobs/{job_id}/artifacts/{name}?variant=quick")

    # the quick files: whole, at the preview resolution, in the job's own folder, and not
    # the full result's
    ingest = job.ledger[PipelineStage.INGEST]
    assert QUICK_IMAGE in ingest.outputs
    reconstruct = job.ledger[PipelineStage.RECONSTRUCT]
    assert reconstruct.facts["quick_resolution"] == str(SMALL["preview"])
    quick = quick_files(storage, job)
    count = int(reconstruct.facts["quick_gaussian_count"])
    formats.verify_ply(quick["gaussian_ply"], expected_count=count)
    formats.verify_splat(quick["splat"], expected_count=count)
    formats.verify_png(quick["rendered_preview"], SMALL["preview"], SMALL["preview"])
    assert count < int(reconstruct.facts["gaussian_count"])
    full = storage.path_of(artifact_key(job_id, "scene.ply", job.artifact_run)).read_bytes()
    assert full != quick["gaussian_ply"]
    # one forward pass of each kind ran, and the stage's work counts them both
    assert sorted(q for q, _ in stage_handlers.gpu.pass_log) == ["full", "preview"]
    assert stage_handlers.store.work_done[PipelineStage.RECONSTRUCT] == 1

    # cleanup deletes the intermediates, not the quick result the event points at
    await start_stages(stage_handlers, "cleanup")
    await cleaned(queue, job_id)
    after = await queue.get(job_id)
    assert after is not None
    assert quick_files(storage, after) == quick
    assert QUICK_IMAGE not in after.ledger[PipelineStage.INGEST].outputs  # deleted, not named


class FailOnceAfterWork:
    """The real stage handlers, except that `stage`'s first run fails (transient) after its
    work is done and stored, before its advance: the run a crash would interrupt there."""

    def __init__(self, inner: StageHandlers, stage: PipelineStage) -> None:
        self.inner = inner
        self.stage = stage
        self.failed = 0

    def handler(self, stage: PipelineStage) -> JobHandler:
        real = self.inner.handler(stage)
        if stage is not self.stage:
            return real

        async def run(ctx: JobContext) -> Any:
            done = await real(ctx)
            if not self.failed:
                self.failed += 1
                raise TransientError("lost after the work", code="TEST_FAULT")
            return done

        return run

    async def cleanup(self, job_id: str) -> int:
        return await self.inner.cleanup(job_id)


async def test_a_retried_reconstruct_announces_the_quick_result_once(
    queue: JobQueue,
    redis: Redis,
    storage: LocalFileStorage,
    stage_handlers: StageHandlers,
    start_stages: StagesFactory,
) -> None:
    """The first run did the work (both passes, the quick files, the announcement) and
    failed before its advance. The retry reuses the stored outputs (no pass runs again) and
    finds the announcement made: preview_ready went out once in all."""
    job_id = (await queue.enqueue(await progressive_spec(storage))).job_id
    flaky = FailOnceAfterWork(stage_handlers, PipelineStage.RECONSTRUCT)
    await start_stages(flaky, "all")
    job = await wait_for_status(queue, job_id, {"completed", "failed"}, timeout=60)
    assert job.status.value == "completed", job.error
    assert flaky.failed == 1
    record = job.ledger[PipelineStage.RECONSTRUCT]
    assert record.attempts == 2
    assert record.skipped  # the retry reused what the first run stored
    assert stage_handlers.store.work_done[PipelineStage.RECONSTRUCT] == 1
    assert len(stage_handlers.gpu.pass_log) == 2  # one preview pass, one full pass
    names = await job_events(redis, queue, job_id)
    assert names.count(PREVIEW_READY) == 1
    assert names.index(PREVIEW_READY) < names.index(COMPLETED)
    quick = quick_files(storage, job)
    formats.verify_ply(quick["gaussian_ply"])


async def test_an_advance_with_a_second_event_sends_it_once_and_only_when_it_commits(
    queue: JobQueue, redis: Redis
) -> None:
    """advance.lua's `also` event: a run that does not hold the job sends nothing; the
    holder's advance sends its progress event and the second one; a resend of that very call
    (a lost reply) answers ok and sends neither again; nor does a stale run afterwards."""
    job_id = (await queue.enqueue(JobSpec(tenant="acme", quality="full"))).job_id
    reconstruct = queue.for_stage(PipelineStage.INGEST)
    [taken] = await reconstruct.take(0, {StreamName.SYNTHESIS: 1}, 0, "c1")
    assert taken.job is not None

    def advance(token: str, request_id: str) -> Advance:
        return Advance(
            job_id=job_id,
            stream=StreamName.SYNTHESIS,
            entry_id=taken.entry.entry_id,
            token=token,
            stage="ingest",
            next_stage="reconstruct",
            record='{"status":"succeeded","attempts":1}',
            progress=0.2,
            event_extra='"stage":"ingest"',
            also_event=PREVIEW_READY,
            also_extra='"artifacts":{"splat":"u"}',
            request_id=request_id,
        )

    assert await reconstruct.advance(advance("not-the-token", "stale-1")) == ("lease_lost", "")
    assert PREVIEW_READY not in await job_events(redis, queue, job_id)
    good = advance(taken.token, "req-1")
    status, entry = await reconstruct.advance(good)
    assert status == "ok"
    assert await reconstruct.advance(good) == ("ok", entry)  # the resend
    assert await reconstruct.advance(advance(taken.token, "req-2")) == ("lease_lost", "")
    names = await job_events(redis, queue, job_id)
    assert names.count(PREVIEW_READY) == 1
    assert names.count(EventType.PROGRESS.value) == 1
    [(_, payload)] = [p for p in await payloads(redis, queue, job_id) if p[0] == PREVIEW_READY]
    assert payload["data"]["artifacts"] == {"splat": "u"}
    assert payload["data"]["job_id"] == job_id


async def test_a_plain_full_job_and_a_progressive_preview_job_announce_nothing(
    queue: JobQueue,
    redis: Redis,
    storage: LocalFileStorage,
    stage_handlers: StageHandlers,
    start_stages: StagesFactory,
) -> None:
    plain = (await queue.enqueue(await progressive_spec(storage, progressive=False))).job_id
    base = await stored_spec(storage, sample(), quality="preview")
    preview = (
        await queue.enqueue(
            JobSpec(
                tenant="acme",
                quality="preview",
                params={"progressive": True},  # the gateway drops it; the worker ignores it
                input_ref=base.input_ref,
                input_sha256=base.input_sha256,
            )
        )
    ).job_id
    await start_stages(stage_handlers, "all")
    for job_id in (plain, preview):
        job = await wait_for_status(queue, job_id, {"completed", "failed"}, timeout=60)
        assert job.status.value == "completed", job.error
        assert PREVIEW_READY not in await job_events(redis, queue, job_id)
        assert QUICK_IMAGE not in job.ledger[PipelineStage.INGEST].outputs
        assert "quick_run" not in job.ledger[PipelineStage.RECONSTRUCT].facts
        assert not list(storage.path_of(f"jobs/{job_id}").glob("quick-*"))
    # each job ran its one forward pass at its own quality
    assert sorted(q for q, _ in stage_handlers.gpu.pass_log) == ["full", "preview"]


async def test_webhooks_deliver_preview_ready_to_subscribers_and_it_is_not_terminal(
    queue: JobQueue,
    settings: Settings,
    storage: LocalFileStorage,
    stage_handlers: StageHandlers,
    start_stages: StagesFactory,
    start_dispatcher: Callable[[Settings], Dispatcher],  # noqa: F811
    receivers: ReceiverFactory,  # noqa: F811
) -> None:
    """An endpoint subscribed to preview_ready alone gets it alone; one subscribed to
    completed never gets it; the job's own webhook_url, filtered to preview_ready, gets it
    and (terminal events always go) completed, in that order."""
    assert EventType.PREVIEW_READY not in TERMINAL_EVENTS
    assert not Event("1-0", PREVIEW_READY, {}).terminal
    assert not should_deliver(PREVIEW_READY, (COMPLETED,))
    assert should_deliver(PREVIEW_READY, ())
    assert endpoint_wants(PREVIEW_READY, ())
    assert not endpoint_wants(PREVIEW_READY, (COMPLETED,))

    only_preview, only_completed, own = await receivers(), await receivers(), await receivers()
    store = EndpointStore(queue)
    await store.create("acme", only_preview.url, [PREVIEW_READY])
    await store.create("acme", only_completed.url, [COMPLETED])
    spec = await progressive_spec(storage)
    spec = JobSpec(
        tenant="acme",
        quality="full",
        params=spec.params,
        input_ref=spec.input_ref,
        input_sha256=spec.input_sha256,
        webhook_url=own.url,
        webhook_events=(PREVIEW_READY,),
    )
    job_id = (await queue.enqueue(spec)).job_id
    await start_stages(stage_handlers, "all")
    start_dispatcher(dispatcher_settings(settings))
    await wait_for_status(queue, job_id, {"completed"}, timeout=60)

    async def delivered() -> bool:
        log = await WebhookStore(queue).deliveries(job_id)
        return sum(d["outcome"] == "delivered" for d in log) == 4

    await eventually(delivered, timeout=20)

    def events(r: Any) -> list[str]:
        return [orjson.loads(body)["event"] for _, _, body in r.calls]

    assert events(only_preview) == [PREVIEW_READY]
    assert events(only_completed) == [COMPLETED]
    assert events(own) == [PREVIEW_READY, COMPLETED]
    body = orjson.loads(only_preview.calls[0][2])
    assert set(body["data"]["artifacts"]) == set(ARTIFACT_FILES)


class BrokenAt(SmallModel):
    """The small model, failing every forward pass at one input resolution."""

    def __init__(self, resolution: int, error: Exception) -> None:
        super().__init__()
        self.broken_resolution = resolution
        self.error = error

    def infer(self, images: torch.Tensor) -> list[Gaussians]:
        if images.shape[-1] == self.broken_resolution:
            raise self.error
        return super().infer(images)


async def broken_handlers(
    settings: Settings, storage: LocalFileStorage, model: SmallModel
) -> StageHandlers:
    h = make_stage_handlers(settings, storage, model)
    await h.startup(tuple(PipelineStage))
    return h


async def test_a_failed_quick_result_leaves_the_full_result_alone(
    queue: JobQueue,
    redis: Redis,
    settings: Settings,
    storage: LocalFileStorage,
    start_stages: StagesFactory,
) -> None:
    """The quick pass breaks: the job still completes with its full result, sends no
    preview_ready, and the quick variant has nothing to name."""
    model = BrokenAt(SMALL["preview"], RuntimeError("the quick pass broke"))
    handlers = await broken_handlers(settings, storage, model)
    try:
        job_id = (await queue.enqueue(await progressive_spec(storage))).job_id
        await start_stages(handlers, "all")
        job = await wait_for_status(queue, job_id, {"completed", "failed"}, timeout=60)
    finally:
        await handlers.shutdown()
    assert job.status.value == "completed", job.error
    assert PREVIEW_READY not in await job_events(redis, queue, job_id)
    assert "quick_run" not in job.ledger[PipelineStage.RECONSTRUCT].facts
    assert job.ledger[PipelineStage.RECONSTRUCT].attempts == 1


async def test_a_failing_full_pass_fails_with_its_own_code_beside_the_quick_pass(
    queue: JobQueue,
    redis: Redis,
    settings: Settings,
    storage: LocalFileStorage,
    start_stages: StagesFactory,
) -> None:
    """The full pass's error reaches the worker as itself (its code decides the job's fate),
    not wrapped with the quick pass's. A quick result committed before the full pass broke
    may have been announced (it stays downloadable): at most once."""
    model = BrokenAt(SMALL["full"], PermanentError("the full pass broke", code="TEST_BROKEN"))
    handlers = await broken_handlers(settings, storage, model)
    try:
        job_id = (await queue.enqueue(await progressive_spec(storage))).job_id
        await start_stages(handlers, "all")
        job = await wait_for_status(queue, job_id, {"completed", "failed"}, timeout=60)
    finally:
        await handlers.shutdown()
    assert job.status.value == "failed"
    assert job.error is not None
    assert job.error.code == "TEST_BROKEN"
    assert job.current_stage == "reconstruct"
    assert (await job_events(redis, queue, job_id)).count(PREVIEW_READY) <= 1
