"""The engine's two hooks for remote backends: a handler's `Deferred` (back on the delayed set,
no attempt and no delivery counted) and a run's notes (written under the lease fence, seen by
the run that takes the job over, optionally announced by a progress event)."""

from __future__ import annotations

import orjson
from redis.asyncio import Redis

from splatq.shared.engine.ids import partition_of
from splatq.shared.engine.job_context import JobContext
from splatq.shared.engine.jobs import JobOutcome
from splatq.shared.engine.queue import JobQueue
from splatq.shared.engine.scripts import Script, ScriptCall
from splatq.shared.errors import Deferred, LeaseLost
from splatq.shared.testing import WorkerFactory, wait_for_status
from tests.helpers import spec


class DeferTwice:
    """Defers each job twice (noting how often in the job), then completes it."""

    def __init__(self) -> None:
        self.runs: dict[str, int] = {}
        self.seen_notes: list[dict[str, str]] = []

    async def __call__(self, ctx: JobContext) -> JobOutcome:
        self.runs[ctx.job.id] = self.runs.get(ctx.job.id, 0) + 1
        self.seen_notes.append(dict(ctx.job.notes))
        if ctx.job.deferrals < 2:
            await ctx.note({"tries": str(ctx.job.deferrals + 1)}, {"upstream": {"n": 1}})
            raise Deferred(50, "vendor_paused")
        return JobOutcome(compute_time_ms=1)


async def test_a_deferred_job_runs_again_without_burning_attempts(
    queue: JobQueue, redis: Redis, start_worker: WorkerFactory
) -> None:
    """Two deferrals then a success: the job completes with attempts 1 and deliveries 1 (the
    deferred runs gave theirs back), `deferrals` 2, and each later run saw the notes of the
    one before."""
    handler = DeferTwice()
    await start_worker(handler, max_attempts=1)
    result = await queue.enqueue(spec())
    job = await wait_for_status(queue, result.job_id, {"completed", "failed"}, timeout=15)
    assert job.status == "completed", job.error
    assert (job.attempts, job.deliveries, job.deferrals) == (1, 1, 2)
    assert handler.runs[job.id] == 3
    assert [n.get("tries") for n in handler.seen_notes] == [None, "1", "2"]
    raw = await redis.hget(queue.keys.job(job.id), "deferred_reason")
    assert raw == "vendor_paused"


async def test_notes_are_fenced_by_the_lease_and_named_note(
    queue: JobQueue, redis: Redis, start_worker: WorkerFactory
) -> None:
    """A run's notes land in `note.*` fields with a progress event carrying the extra; a run
    whose token is no longer the job's writes nothing; a name outside `note.` is refused."""
    captured: list[JobContext] = []
    refused: list[str] = []

    async def handler(ctx: JobContext) -> JobOutcome:
        captured.append(ctx)
        await ctx.note({"up.full.pred": "p1"}, {"upstream": {"vendor": "v", "request_id": "r"}})
        keys = [ctx.queue.keys.job(ctx.job.id), ctx.queue.keys.events(partition_of(ctx.job.id))]
        raw = ScriptCall(Script.NOTE, keys, [ctx.token, "", "e1", 1000, "", "status", "failed"])
        refused.append(str((await ctx.queue.scripts.run(raw))[0]))
        return JobOutcome(compute_time_ms=1)

    await start_worker(handler)
    result = await queue.enqueue(spec())
    job = await wait_for_status(queue, result.job_id, {"completed"}, timeout=10)
    assert job.notes == {"up.full.pred": "p1"}
    assert refused == ["bad_field"]
    events = await redis.xrange(queue.keys.events(partition_of(job.id)))
    progress = [orjson.loads(f["payload"]) for _, f in events if f["type"].endswith(".progress")]
    assert [p["data"]["upstream"] for p in progress] == [{"vendor": "v", "request_id": "r"}]
    stale = captured[0]
    try:
        await stale.note({"up.full.pred": "p2"})
    except LeaseLost:
        pass
    else:
        raise AssertionError("a finished run's note was accepted")
    assert await redis.hget(queue.keys.job(job.id), "note.up.full.pred") == "p1"
