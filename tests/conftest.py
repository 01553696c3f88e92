"""Fixtures: a real redis-server per session (and per test where a test kills it), engine
objects bound to it, and workers that are always stopped. Thin pytest wrappers over
`splatq.shared.testing` (import helpers from there, not from here)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from redis.asyncio import Redis

from splatq.shared.engine.queue import JobQueue
from splatq.shared.settings import Settings
from splatq.shared.storage.store import LocalFileStorage
from splatq.shared.testing import (
    InProcessWorkers,
    RedisServer,
    StagedWorkers,
    StagesFactory,
    WorkerFactory,
    engine_settings,
    fresh_redis,
    running_redis_server,
)
from tests.handlers import BehaviourHandler
from tests.helpers import GpuHandlerFactory

if TYPE_CHECKING:
    from splatq.services.gpu_worker.handler import GpuJobHandler


@pytest.fixture(scope="session")
async def redis_server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RedisServer]:
    async with running_redis_server(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture
def settings(redis_server: RedisServer) -> Settings:
    return engine_settings(redis_server.url)


@pytest.fixture
async def redis(redis_server: RedisServer) -> AsyncIterator[Redis]:
    async with fresh_redis(redis_server.url) as client:
        yield client


@pytest.fixture
async def queue(redis: Redis, settings: Settings) -> JobQueue:
    q = JobQueue(redis, settings)
    await q.setup()
    return q


@pytest.fixture
def storage(tmp_path: Path) -> LocalFileStorage:
    """Local object storage in a fresh directory."""
    return LocalFileStorage(tmp_path / "objects")


@pytest.fixture
async def start_worker(redis: Redis, settings: Settings) -> AsyncIterator[WorkerFactory]:
    """Start in-process workers (own JobQueue each; tests.handlers' BehaviourHandler unless
    given one); all are stopped after the test."""
    workers = InProcessWorkers(redis, settings, BehaviourHandler())
    yield workers.start
    await workers.stop_all()


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
    """Start in-process staged workers (`StagedWorkers.start`: one fleet member per call);
    all are stopped after the test. Returns the started workers."""
    staged = StagedWorkers(redis, settings)
    yield staged.start
    await staged.stop_all()


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
