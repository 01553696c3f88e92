"""Fixtures: a real redis-server per session (and per test where a test kills it), engine
objects bound to it, and workers that are always stopped."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from redis.asyncio import Redis

from splatq.shared.engine.job_context import JobHandler
from splatq.shared.engine.jobs import JobRecord, JobSpec
from splatq.shared.engine.queue import JobQueue
from splatq.shared.engine.worker import Worker
from splatq.shared.redis.client import connect
from splatq.shared.redis.server import RedisServer
from splatq.shared.settings import Settings
from splatq.shared.storage.store import LocalFileStorage
from tests.handlers import BehaviourHandler

if TYPE_CHECKING:
    from splatq.services.gpu_worker.handler import GpuJobHandler

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
async def redis_server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"), appendonly=False)
    await server.start()
    yield server
    await server.stop()


def engine_settings(redis_url: str, **overrides: Any) -> Settings:
    """Short leases and intervals so crash recovery takes about a second, not minutes."""
    base = Settings(
        redis_url=redis_url,
        lease_ttl_ms=900,
        reaper_interval_ms=200,
        retry_base_ms=20,
        retry_cap_ms=100,
        worker_concurrency=4,
        fetch_block_ms=100,
        shutdown_grace_s=3.0,
        max_deliveries=3,
        max_attempts=3,
    )
    return base.with_overrides(**overrides)


@pytest.fixture
def settings(redis_server: RedisServer) -> Settings:
    return engine_settings(redis_server.url)


@pytest.fixture
async def redis(redis_server: RedisServer) -> AsyncIterator[Redis]:
    client = connect(redis_server.url)
    await client.flushall()
    yield client
    await client.aclose()


@pytest.fixture
async def queue(redis: Redis, settings: Settings) -> JobQueue:
    q = JobQueue(redis, settings)
    await q.setup()
    return q


@pytest.fixture
def storage(tmp_path: Path) -> LocalFileStorage:
    """Local object storage in a fresh directory."""
    return LocalFileStorage(tmp_path / "objects")


WorkerFactory = Callable[..., Awaitable[Worker]]


@pytest.fixture
async def start_worker(redis: Redis, settings: Settings) -> AsyncIterator[WorkerFactory]:
    """Start in-process workers (own JobQueue each); all are stopped after the test."""
    started: list[tuple[Worker, asyncio.Task[None]]] = []

    async def factory(handler: JobHandler | None = None, **overrides: Any) -> Worker:
        s = settings.with_overrides(**overrides)
        worker = Worker(JobQueue(redis, s), s, handler or BehaviourHandler())
        task = asyncio.create_task(worker.run())
        started.append((worker, task))
        return worker

    yield factory
    for worker, _ in started:
        worker.stop()
    for worker, task in started:
        # A stopped worker ends after its blocking read returns; a test that chose a long
        # block (an idle worker's wake-up) has nothing left for it to do: cancel sooner.
        long_block = worker.settings.fetch_block_ms > 5_000
        await finish_or_cancel(task, timeout_s=1.0 if long_block else 15.0)


StagesFactory = Callable[..., Awaitable[list[Any]]]


@pytest.fixture
async def stage_handlers(settings: Settings, storage: LocalFileStorage) -> AsyncIterator[Any]:
    """The 3DGS stage handlers (services/gpu_worker/stages.py) on CPU with the builtin model
    and this test's storage, every stage started; shut down after the test."""
    from prometheus_client import CollectorRegistry  # noqa: PLC0415 - torch-heavy imports

    from splatq.services.gpu_worker.handler import GpuJobHandler  # noqa: PLC0415
    from splatq.services.gpu_worker.metrics import GpuMetrics  # noqa: PLC0415
    from splatq.services.gpu_worker.model import load_model  # noqa: PLC0415
    from splatq.services.gpu_worker.stages import StageHandlers  # noqa: PLC0415
    from splatq.shared.engine.stages import PipelineStage  # noqa: PLC0415

    h = StageHandlers(
        GpuJobHandler(
            settings.with_overrides(device="cpu"),
            load_model("builtin"),
            storage,
            GpuMetrics.create(CollectorRegistry()),
        )
    )
    await h.startup(tuple(PipelineStage))
    yield h
    await h.shutdown()


@pytest.fixture
async def start_stages(redis: Redis, settings: Settings) -> AsyncIterator[StagesFactory]:
    """Start in-process staged workers: one `Worker` per job stage given (on that stage's
    streams, with its own queue) and the cleanup consumer when `cleanup` is given, one fleet
    member per call (as a staged process); all are stopped after the test. Returns the
    started workers."""
    from splatq.shared.engine.cleanup import CleanupWorker  # noqa: PLC0415
    from splatq.shared.engine.fleet import FleetMember  # noqa: PLC0415
    from splatq.shared.engine.stages import PIPELINE, PipelineStage  # noqa: PLC0415

    started: list[tuple[Any, asyncio.Task[None]]] = []

    async def factory(handlers: Any, stages: Any = "all", **overrides: Any) -> list[Any]:
        from splatq.shared.engine.stages import parse_stage_list  # noqa: PLC0415

        chosen = parse_stage_list(stages) if isinstance(stages, str) else tuple(stages)
        s = settings.with_overrides(**overrides)
        out: list[Any] = []
        member = FleetMember()
        for stage in chosen:
            if stage in PIPELINE:
                q = JobQueue(redis, s).for_stage(stage)
                h = handlers.handler(stage)
                w: Any = Worker(q, s.for_stage(stage.value), h, member=member)
            elif stage is PipelineStage.CLEANUP:
                q = JobQueue(redis, s)
                w = CleanupWorker(q, handlers.cleanup, consumer=member.name, claim_idle_ms=1000)
            else:
                continue
            started.append((w, asyncio.create_task(w.run())))
            out.append(w)
        return out

    yield factory
    for w, _ in started:
        w.stop()
    for _, task in started:
        await finish_or_cancel(task)


async def finish_or_cancel(task: asyncio.Task[None], timeout_s: float = 15.0) -> None:
    """Wait for a stopped service's task to end; cancel it if it does not in time."""
    try:
        await asyncio.wait_for(task, timeout=timeout_s)
    except TimeoutError:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def wait_until(
    predicate: Callable[[], Awaitable[bool]], timeout_s: float = 10.0, interval_s: float = 0.02
) -> float:
    """Poll an observable condition until true; returns seconds waited, fails on timeout."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while not await predicate():
        if loop.time() - start > timeout_s:
            raise AssertionError(f"condition not met within {timeout_s}s")
        await asyncio.sleep(interval_s)
    return loop.time() - start


async def wait_for_status(
    queue: JobQueue, job_id: str, statuses: set[str], timeout_s: float = 10.0
) -> JobRecord:
    async def reached() -> bool:
        job = await queue.get(job_id)
        return job is not None and job.status.value in statuses

    await wait_until(reached, timeout_s)
    job = await queue.get(job_id)
    assert job is not None
    return job


async def job_events(redis: Redis, queue: JobQueue, job_id: str) -> list[str]:
    """The event types appended for one job, in order."""
    from splatq.shared.engine.ids import partition_of  # noqa: PLC0415

    entries = await redis.xrange(queue.keys.events(partition_of(job_id)))
    return [f["type"] for _, f in entries if f.get("job_id") == job_id]


def spec(quality: str = "preview", **metadata: Any) -> JobSpec:
    return JobSpec(tenant="acme", quality=quality, metadata=metadata)


GpuHandlerFactory = Callable[[Settings], Awaitable["GpuJobHandler"]]


@pytest.fixture
async def gpu_handler_factory(storage: LocalFileStorage) -> AsyncIterator[GpuHandlerFactory]:
    """Build started GPU-worker handlers (CPU, builtin model, this test's storage and its own
    metrics registry); all are shut down after the test."""
    from prometheus_client import CollectorRegistry  # noqa: PLC0415 - torch-heavy imports

    from splatq.services.gpu_worker.handler import GpuJobHandler  # noqa: PLC0415
    from splatq.services.gpu_worker.metrics import GpuMetrics  # noqa: PLC0415
    from splatq.services.gpu_worker.model import load_model  # noqa: PLC0415

    handlers: list[GpuJobHandler] = []

    async def make(settings: Settings) -> GpuJobHandler:
        h = GpuJobHandler(
            settings.with_overrides(device="cpu"),
            load_model("builtin"),
            storage,
            GpuMetrics.create(CollectorRegistry()),
        )
        await h.startup()
        handlers.append(h)
        return h

    yield make
    for h in handlers:
        await h.shutdown()
