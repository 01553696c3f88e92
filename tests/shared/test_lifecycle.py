"""A job's path through the engine: enqueue -> start -> commit -> ack -> events."""

from __future__ import annotations

from dataclasses import replace

import orjson
from redis.asyncio import Redis

from splatq.shared.engine.queue import JobQueue
from splatq.shared.testing import WorkerFactory, job_events, wait_for_status
from tests.helpers import spec


async def test_job_completes_with_events_in_order_and_stream_trimmed(
    queue: JobQueue, redis: Redis, start_worker: WorkerFactory
) -> None:
    """A completed job has its artifacts, one attempt, its events in order, and its stream
    entry acked and deleted."""
    result = await queue.enqueue(spec(sleep_s=0.2))
    assert result.created
    await start_worker()
    job = await wait_for_status(queue, result.job_id, {"completed"})
    assert job.artifacts == {"result": f"mem://{job.id}/result"}
    assert job.attempts == 1
    assert job.deliveries == 1
    assert job.progress == 1.0
    types = await job_events(redis, queue, job.id)
    assert types[0] == "3d_reconstruction.queued"
    assert types[1] == "3d_reconstruction.started"
    assert types[-1] == "3d_reconstruction.completed"
    assert "3d_reconstruction.progress" in types
    assert await redis.xlen(queue.keys.stream(0, job.stream)) == 0
    pending = await redis.xpending(queue.keys.stream(0, job.stream), queue.group)
    assert pending["pending"] == 0


async def test_completed_event_payload_matches_the_contract(
    queue: JobQueue, redis: Redis, start_worker: WorkerFactory
) -> None:
    """The completed event carries job_id, model, compute_time_ms, metadata and artifacts."""
    result = await queue.enqueue(spec(order="A-17"))
    await start_worker()
    await wait_for_status(queue, result.job_id, {"completed"})
    entries = await redis.xrange(queue.keys.events(0))
    payloads = [orjson.loads(f["payload"]) for _, f in entries if f["type"].endswith("completed")]
    assert len(payloads) == 1
    event = payloads[0]
    assert event["event"] == "3d_reconstruction.completed"
    assert event["id"].startswith("evt_")
    assert isinstance(event["timestamp"], int)
    data = event["data"]
    assert data["job_id"] == result.job_id
    assert data["model"] == "test-model"
    assert data["metadata"] == {"order": "A-17"}
    assert data["artifacts"] == {"result": f"mem://{result.job_id}/result"}
    assert isinstance(data["compute_time_ms"], int)


async def test_permanent_error_fails_at_once_with_its_code(
    queue: JobQueue, redis: Redis, start_worker: WorkerFactory
) -> None:
    """A PermanentError ends the job `failed` after one attempt, with code and failed event."""
    result = await queue.enqueue(spec(fail="permanent"))
    await start_worker()
    job = await wait_for_status(queue, result.job_id, {"failed"})
    assert job.attempts == 1
    assert job.error is not None
    assert (job.error.code, job.error.retryable) == ("INPUT_CORRUPT", False)
    assert (await job_events(redis, queue, job.id))[-1] == "3d_reconstruction.failed"


async def test_transient_error_is_retried_through_the_delayed_set(
    queue: JobQueue, redis: Redis, start_worker: WorkerFactory
) -> None:
    """A TransientError parks the job (retrying) and a later attempt completes it."""
    result = await queue.enqueue(spec(fail="transient_once"))
    await start_worker()
    job = await wait_for_status(queue, result.job_id, {"completed"})
    assert job.attempts == 2
    assert job.error is None
    assert await redis.zcard(queue.keys.delayed(0)) == 0
    types = await job_events(redis, queue, job.id)
    assert types.count("3d_reconstruction.started") == 2
    assert types.count("3d_reconstruction.completed") == 1


async def test_transient_errors_fail_the_job_after_max_attempts(
    queue: JobQueue, redis: Redis, start_worker: WorkerFactory
) -> None:
    """Retries stop at SPLATQ_MAX_ATTEMPTS; the job fails with the last error, retryable."""
    result = await queue.enqueue(spec(fail="transient"))
    await start_worker()
    job = await wait_for_status(queue, result.job_id, {"failed"})
    assert job.attempts == 3
    assert job.error is not None
    assert job.error.code == "STORAGE_TIMEOUT"
    assert job.error.retryable


async def test_cancel_of_a_queued_job_ends_it_without_running(
    queue: JobQueue, redis: Redis, start_worker: WorkerFactory
) -> None:
    """Canceling before a worker starts it: canceled at once, never run, entry dropped."""
    result = await queue.enqueue(spec())
    assert await queue.cancel(result.job_id) == "canceled"
    assert await queue.cancel(result.job_id) == "already_finished"
    await start_worker()
    other = await queue.enqueue(spec())
    await wait_for_status(queue, other.job_id, {"completed"})
    job = await queue.get(result.job_id)
    assert job is not None
    assert job.status == "canceled"
    assert job.attempts == 0
    assert await redis.get(f"test:runs:{result.job_id}") is None


async def test_cancel_mid_job_stops_at_the_next_stage_with_no_artifacts(
    queue: JobQueue, redis: Redis, start_worker: WorkerFactory
) -> None:
    """A processing job sees the cancel on its next heartbeat/progress and ends canceled."""
    result = await queue.enqueue(spec(sleep_s=5))
    await start_worker()
    await wait_for_status(queue, result.job_id, {"processing"})
    assert await queue.cancel(result.job_id) == "cancel_requested"
    job = await wait_for_status(queue, result.job_id, {"canceled"}, timeout=3)
    assert job.artifacts is None
    types = await job_events(redis, queue, job.id)
    assert types[-1] == "3d_reconstruction.canceled"
    assert "3d_reconstruction.completed" not in types


async def test_cancel_with_another_tenant_answers_not_found(queue: JobQueue) -> None:
    """Tenant isolation starts in the engine: another tenant's job is not found."""
    result = await queue.enqueue(spec())
    assert await queue.cancel(result.job_id, tenant="someone-else") == "not_found"
    job = await queue.get(result.job_id)
    assert job is not None
    assert job.status == "queued"


async def test_enqueue_answers_the_record_it_stored_without_reading_it_back(
    queue: JobQueue, redis: Redis
) -> None:
    """enqueue.lua answers only what it assigned; the producer joins it to what it sent. The
    record it builds is the stored one (the fair feed may have moved the job into the stream
    in the same step: only its entry id can differ)."""
    result = await queue.enqueue(spec(order="A-1"))
    stored = await queue.get(result.job_id)
    assert result.job is not None
    assert stored is not None
    assert result.job == replace(stored, entry_id=result.job.entry_id)
