"""The queue gauges against a real Redis: waiting jobs (in the tenants' fair queues or in the
stream) are counted and aged apart from running ones; no -1 sentinel; the gateway's registry
holds no worker family."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from splatq.shared.engine.metrics import EngineMetrics, QueueMetrics
from splatq.shared.engine.queue import JobQueue
from splatq.shared.engine.stages import PipelineStage
from splatq.shared.redis.server import RedisServer
from splatq.shared.testing import WorkerFactory, engine_settings, eventually, wait_for_status
from tests.helpers import spec


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


@pytest.mark.parametrize("fair", [True, False], ids=["fair-queues", "arrival-order"])
async def test_waiting_jobs_are_counted_and_aged_apart_from_running_ones(
    fair: bool, redis_server: RedisServer, queue: JobQueue, start_worker: WorkerFactory
) -> None:
    settings = engine_settings(redis_server.url, fair_scheduling=fair)
    q = JobQueue(queue.redis, settings)
    registry = CollectorRegistry()
    metrics = QueueMetrics.create(registry)
    ids = [(await q.enqueue(spec(sleep_s=30))).job_id for _ in range(3)]
    where = {"stream": "interactive", "partition": "0"}

    async def aged() -> bool:
        await metrics.sample(q, (0,))
        return (value(registry, "splatq_oldest_waiting_age_seconds", **where) or 0) > 0

    await eventually(aged, timeout=10)
    assert value(registry, "splatq_queue_depth", **where) == 3
    assert value(registry, "splatq_jobs_in_state", state="queued", partition="0") == 3
    assert value(registry, "splatq_jobs_in_state", state="processing", partition="0") == 0
    assert value(registry, "splatq_oldest_pending_age_seconds", **where) == 0

    # One slot: one job runs, two wait.
    await start_worker(worker_concurrency=1, interactive_share=1.0, fair_scheduling=fair)
    await wait_for_status(q, ids[0], {"processing"})

    async def one_running() -> bool:
        await metrics.sample(q, (0,))
        return value(registry, "splatq_jobs_in_state", state="processing", partition="0") == 1

    await eventually(one_running, timeout=10)
    assert value(registry, "splatq_jobs_in_state", state="queued", partition="0") == 2
    assert value(registry, "splatq_queue_depth", **where) == 2
    assert (value(registry, "splatq_oldest_waiting_age_seconds", **where) or 0) > 0
    for family in registry.collect():
        for sample in family.samples:
            assert sample.value >= 0, sample  # no sentinel


def test_the_gateway_registry_has_no_worker_families() -> None:
    gateway, worker = CollectorRegistry(), CollectorRegistry()
    QueueMetrics.create(gateway)
    EngineMetrics.create(worker)
    gateway_names = {f.name for f in gateway.collect()}
    worker_only = {f.name for f in worker.collect()} - gateway_names
    assert "splatq_job_queue_wait_duration_seconds" in worker_only
    assert "splatq_deliveries" in worker_only
    assert not gateway_names & worker_only


async def test_a_staged_worker_samples_the_entry_gauges_as_the_gateway_does(
    redis_server: RedisServer, queue: JobQueue
) -> None:
    """A GPU pod's sampler (its queue reads the reconstruct streams) reports the entry streams'
    gauges as the gateway's sampler does, and every stage's gauges besides: queue gauges are
    aggregated with max() across processes, so each must report the same values."""
    settings = engine_settings(redis_server.url, fair_scheduling=False)
    entry = JobQueue(queue.redis, settings)
    gpu_pod = entry.for_stage(PipelineStage.RECONSTRUCT)
    for stage in PipelineStage:
        await entry.for_stage(stage).setup()  # as each stage's worker does first
    await entry.enqueue(spec())
    gateway, gpu = CollectorRegistry(), CollectorRegistry()
    await QueueMetrics.create(gateway).sample(entry, (0,))
    await QueueMetrics.create(gpu).sample(gpu_pod, (0,), staged=True)
    where = {"stream": "interactive", "partition": "0"}
    assert value(gateway, "splatq_queue_depth", **where) == 1
    for family in gateway.collect():
        for sample in family.samples:
            theirs = value(gpu, sample.name, **sample.labels)
            if sample.name.endswith("_age_seconds"):  # sampled a moment later
                assert theirs is not None, sample
                assert sample.value <= theirs <= sample.value + 5, sample
            else:
                assert theirs == sample.value, sample
    assert value(gpu, "splatq_stage_depth", stage="ingest", **where) == 1
    assert value(gpu, "splatq_stage_depth", stage="reconstruct", **where) == 0


async def test_a_job_between_stages_is_counted_as_queued_by_every_sampler(
    redis_server: RedisServer, queue: JobQueue
) -> None:
    """A job that left ingest and waits for reconstruct is still a queued job: the gateway's
    sampler (which runs no stage) counts it, and in the reconstruct stage's depth."""
    from splatq.shared.engine.keys import StreamName  # noqa: PLC0415
    from splatq.shared.engine.queue import Advance  # noqa: PLC0415

    settings = engine_settings(redis_server.url, fair_scheduling=False)
    entry = JobQueue(queue.redis, settings)
    job_id = (await entry.enqueue(spec())).job_id
    ingest = entry.for_stage(PipelineStage.INGEST)
    [taken] = await ingest.take(0, {StreamName.INTERACTIVE: 1}, 0, "c1")
    status, _ = await ingest.advance(
        Advance(
            job_id,
            StreamName.INTERACTIVE,
            taken.entry.entry_id,
            taken.token,
            "ingest",
            "reconstruct",
            '{"status":"succeeded"}',
            0.2,
            '"stage":"ingest"',
        )
    )
    assert status == "ok"
    gateway = CollectorRegistry()
    await QueueMetrics.create(gateway).sample(entry, (0,))
    assert value(gateway, "splatq_jobs_in_state", state="queued", partition="0") == 1
    where = {"stream": "interactive", "partition": "0"}
    assert value(gateway, "splatq_stage_depth", stage="reconstruct", **where) == 1
    assert value(gateway, "splatq_queue_depth", **where) == 0
