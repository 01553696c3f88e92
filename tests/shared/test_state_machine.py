"""The job state machine: the table is the single source, and Lua enforces every edge."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from redis.asyncio import Redis

from splatq.shared.engine.jobs import JobSpec
from splatq.shared.engine.queue import Finish, JobQueue, StreamEntry
from splatq.shared.engine.states import ALLOWED_TRANSITIONS, TERMINAL, JobStatus, is_allowed

FINISH_TARGETS = [
    JobStatus.COMPLETED,
    JobStatus.FAILED,
    JobStatus.CANCELED,
    JobStatus.RETRYING,
    JobStatus.QUEUED,
]


def test_terminal_states_have_no_way_out_except_redrive() -> None:
    """completed and canceled are final; failed may only be redriven back to queued."""
    assert ALLOWED_TRANSITIONS[JobStatus.COMPLETED] == frozenset()
    assert ALLOWED_TRANSITIONS[JobStatus.CANCELED] == frozenset()
    assert ALLOWED_TRANSITIONS[JobStatus.FAILED] == frozenset({JobStatus.QUEUED})


def test_every_non_terminal_state_can_be_canceled() -> None:
    """Cancel is allowed from any non-terminal state."""
    for status in JobStatus:
        assert is_allowed(status, JobStatus.CANCELED) == (status not in TERMINAL)


async def _job_in(queue: JobQueue, redis: Redis, status: JobStatus) -> tuple[str, str, str]:
    """A job forced into `status`, holding lease `tok`; returns (job_id, entry_id, events key)."""
    result = await queue.enqueue(JobSpec(tenant="t", quality="preview"))
    job = await queue.get(result.job_id)
    assert job is not None
    await redis.hset(queue.keys.job(job.id), mapping={"status": status.value, "lease_token": "tok"})
    await redis.set(queue.keys.lease(job.id), "tok", px=60_000)
    return job.id, job.entry_id, queue.keys.events(0)


@pytest.mark.parametrize(
    ("current", "target"), list(itertools.product(list(JobStatus), FINISH_TARGETS))
)
async def test_finish_applies_exactly_the_allowed_transitions(
    queue: JobQueue, redis: Redis, current: JobStatus, target: JobStatus
) -> None:
    """finish.lua moves the job iff the table allows it; a refused move changes nothing."""
    job_id, entry_id, events_key = await _job_in(queue, redis, current)
    events_before = await redis.xlen(events_key)
    [(outcome, _)] = await queue.finish_many(
        [
            Finish(
                job_id=job_id,
                stream=JobSpec(tenant="t", quality="preview").stream,
                entry_id=entry_id,
                token="tok",
                target=target.value,
                event="3d_reconstruction.completed" if target == JobStatus.COMPLETED else "",
            )
        ]
    )
    job = await queue.get(job_id)
    assert job is not None
    if is_allowed(current, target):
        assert outcome == "ok"
        assert job.status == target
    else:
        assert outcome in {"illegal", "already"}
        assert job.status == current
        assert await redis.xlen(events_key) == events_before


@pytest.mark.parametrize("current", list(JobStatus))
async def test_start_only_from_queued_or_retrying(
    queue: JobQueue, redis: Redis, current: JobStatus
) -> None:
    """start.lua takes a job to processing only from queued or retrying."""
    job_id, entry_id, _ = await _job_in(queue, redis, current)
    await redis.delete(queue.keys.lease(job_id))
    job = await queue.get(job_id)
    assert job is not None
    entry = StreamEntry(0, job.stream, entry_id, {"v": "1", "job": job_id})
    [result] = await queue.start_many([entry], ["new-token"], "c1")
    after = await queue.get(job_id)
    assert after is not None
    if is_allowed(current, JobStatus.PROCESSING):
        assert result.outcome == "started"
        assert after.status == JobStatus.PROCESSING
    else:
        assert result.outcome != "started"
        assert after.status == current


@pytest.mark.parametrize("current", list(JobStatus))
async def test_user_cancel_respects_the_table(
    queue: JobQueue, redis: Redis, current: JobStatus
) -> None:
    """cancel.lua cancels non-terminal jobs (processing ones by flag), refuses terminal ones."""
    job_id, _, _ = await _job_in(queue, redis, current)
    outcome = await queue.cancel(job_id)
    job = await queue.get(job_id)
    assert job is not None
    if current == JobStatus.PROCESSING:
        assert outcome == "cancel_requested"
        assert job.status == JobStatus.PROCESSING
        assert job.cancel_requested
    elif is_allowed(current, JobStatus.CANCELED):
        assert outcome == "canceled"
        assert job.status == JobStatus.CANCELED
    else:
        assert outcome == "already_finished"
        assert job.status == current


async def test_finish_without_the_lease_commits_nothing(queue: JobQueue, redis: Redis) -> None:
    """A worker whose lease was taken over (token mismatch) cannot commit or ack."""
    job_id, entry_id, events_key = await _job_in(queue, redis, JobStatus.PROCESSING)
    before = await redis.xlen(events_key)
    job = await queue.get(job_id)
    assert job is not None
    [(outcome, _)] = await queue.finish_many(
        [Finish(job_id, job.stream, entry_id, "stale-token", "completed")]
    )
    assert outcome == "lease_lost"
    after = await queue.get(job_id)
    assert after is not None
    assert after.status == JobStatus.PROCESSING
    assert await redis.xlen(events_key) == before


async def test_repeated_completion_commits_once(queue: JobQueue, redis: Redis) -> None:
    """A resent commit (reply lost) is answered what the first execution answered, from the
    replay memo; a second commit under another request id is answered `already`. Neither
    appends a second event."""
    job_id, entry_id, events_key = await _job_in(queue, redis, JobStatus.PROCESSING)
    job = await queue.get(job_id)
    assert job is not None
    done = Finish(
        job_id, job.stream, entry_id, "tok", "completed", event="3d_reconstruction.completed"
    )
    assert (await queue.finish_many([done]))[0][0] == "ok"
    n = await redis.xlen(events_key)
    assert (await queue.finish_many([done]))[0] == ("ok", "completed")
    again = dataclasses.replace(done, request_id="another-call")
    assert (await queue.finish_many([again]))[0][0] == "already"
    assert await redis.xlen(events_key) == n
