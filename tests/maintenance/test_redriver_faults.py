"""The redriver's policy sweep under Redis faults: replies lost after task_claim, a redrive
or a checkpoint ran (through tests/faultproxy.py), an OOM error reply in the middle of a run
(a real redis-server at its maxmemory), and a Lua error on one corrupt record. Each time:
no entry redriven twice, none lost, and a run that failed resumes from its checkpoint."""

from __future__ import annotations

import contextlib
from pathlib import Path

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from splatq.services.dlq_redriver.service import task_store
from splatq.shared.engine.events import EventType
from splatq.shared.engine.queue import JobQueue
from splatq.shared.engine.scripts import Script
from splatq.shared.maintenance.scheduler import RunResult, Scheduler
from splatq.shared.maintenance.scripts import MaintenanceScript
from splatq.shared.maintenance.store import Claim, Refusal, TaskStore
from splatq.shared.maintenance.tasks import redrive_sweep
from splatq.shared.redis.client import connect
from splatq.shared.redis.server import RedisServer
from splatq.shared.testing import engine_settings, eventually, job_events
from tests.fault_fixtures import own_server, proxied, proxy, sha
from tests.faultproxy import FaultProxy
from tests.maintenance.helpers import audit_actions, config_at, dead_letter_jobs, write_config

__all__ = ["own_server", "proxied", "proxy"]  # fixtures
SWEEP = "redrive_sweep"
QUEUED = EventType.QUEUED.value


def sweeper(queue: JobQueue, tmp_path: Path, store: TaskStore | None = None) -> Scheduler:
    """The policy sweep alone (poison-retry, batches of 3), its lock lapsing after 1 s."""
    config = config_at(write_config(tmp_path / "policies.toml", batch=3, budget=3))
    task = redrive_sweep(queue, config, "test", None)
    return Scheduler(store or task_store(queue), [task], "test", 1000, 0.05)


async def redriven_once(redis: Redis, queue: JobQueue, job_ids: list[str]) -> None:
    """Every job redriven exactly once: one audit record, one redrive, queued, one `queued`
    event beside its enqueue's; and the dead-letter stream empty."""
    assert await redis.xlen(queue.keys.dead_letters(0)) == 0
    for job_id in job_ids:
        assert await audit_actions(redis, queue, job_id) == ["redriven"]
        record = await redis.hmget(queue.keys.job(job_id), ["status", "redrives"])  # type: ignore[misc]
        assert record == ["queued", "1"]
        assert (await job_events(redis, queue, job_id)).count(QUEUED) == 2


async def test_lost_replies_of_claim_redrive_and_checkpoint_redrive_each_entry_once(
    proxied: JobQueue, proxy: FaultProxy, queue: JobQueue, redis: Redis, tmp_path: Path
) -> None:
    """task_claim's reply, two redrive batches' replies and a checkpoint's reply are lost
    after Redis ran them: the resends answer what the first executions did (the replay
    memo), so one run covers everything and nothing is redriven twice."""
    job_ids = await dead_letter_jobs(queue, redis, count=7)
    proxy.lose_reply_after(sha(proxied, MaintenanceScript.TASK_CLAIM))
    proxy.lose_reply_after(sha(proxied, Script.REDRIVE), times=2)
    proxy.lose_reply_after(sha(proxied, MaintenanceScript.TASK_RENEW))
    result = await sweeper(proxied, tmp_path).run_now(SWEEP)
    assert isinstance(result, RunResult)
    assert result.outcome.value == "success", result.summary
    assert "redriven 7" in result.summary, result.summary
    assert proxy.lost_replies == 4
    await redriven_once(redis, queue, job_ids)
    history = await task_store(queue).history(SWEEP)
    assert [h["outcome"] for h in history] == ["success"]


class OutOfMemoryAfterFirstCheckpoint(TaskStore):
    """Redis reaches its maxmemory right after the run's first checkpoint was saved."""

    def __init__(self, queue: JobQueue, admin: Redis) -> None:
        base = task_store(queue)
        super().__init__(base.redis, base.scripts, base.keys)
        self.admin = admin
        self.checkpoint = ""

    async def renew(self, claim: Claim, ttl_ms: int, checkpoint: str | None = None) -> bool:
        held = await super().renew(claim, ttl_ms, checkpoint)
        if checkpoint and not self.checkpoint:
            self.checkpoint = checkpoint
            await self.admin.config_set("maxmemory", "1")
        return held


async def test_an_oom_reply_mid_run_fails_it_and_the_next_run_resumes_from_its_checkpoint(
    own_server: RedisServer, tmp_path: Path
) -> None:
    client = connect(own_server.url)
    try:
        queue = JobQueue(client, engine_settings(own_server.url))
        await queue.setup()
        job_ids = await dead_letter_jobs(queue, client, count=8)
        store = OutOfMemoryAfterFirstCheckpoint(queue, client)
        scheduler = sweeper(queue, tmp_path, store)
        # The run redrives a batch of 3, saves its checkpoint, then every write answers OOM
        # (the rate limiter's, a redrive's, the run's own end): it fails where it stands.
        with contextlib.suppress(ResponseError):
            failed = await scheduler.run_now(SWEEP)
            assert isinstance(failed, RunResult)
            assert failed.outcome.value == "failure", failed.summary
        assert store.checkpoint
        assert await client.xlen(queue.keys.dead_letters(0)) == 5  # nothing lost, 3 redriven
        await client.config_set("maxmemory", "0")

        async def rerun() -> bool:  # refused (busy) until the failed run's lock has lapsed
            result = await scheduler.run_now(SWEEP)
            if isinstance(result, Refusal):
                return False
            assert result.outcome.value == "success", result.summary
            assert "redriven 5" in result.summary, result.summary
            return True

        await eventually(rerun, timeout=15, interval=0.1)
        latest = (await store.history(SWEEP))[0]
        assert (latest["outcome"], latest["resumed_from"]) == ("success", store.checkpoint)
        await redriven_once(client, queue, job_ids)
    finally:
        await client.config_set("maxmemory", "0")
        await client.aclose()


async def test_an_error_reply_reading_one_record_holds_its_entry_and_redrives_the_rest_once(
    queue: JobQueue, redis: Redis, tmp_path: Path
) -> None:
    """One job record is not a hash: reading it answers WRONGTYPE in the middle of the
    sweep's first batch. That entry is held (its subject cannot be read) and stays a dead
    letter; the sweep goes on past it -- it does not fail at that batch on every run -- the
    others are redriven once, and a second sweep redrives nothing again."""
    job_ids = await dead_letter_jobs(queue, redis, count=6)
    corrupt = job_ids[1]
    await redis.delete(queue.keys.job(corrupt))
    await redis.set(queue.keys.job(corrupt), "not a hash")
    scheduler = sweeper(queue, tmp_path)
    summaries = []
    for _ in range(2):
        result = await scheduler.run_now(SWEEP)
        assert isinstance(result, RunResult)
        assert result.outcome.value == "success", result.summary
        summaries.append(result.summary)
    assert summaries == [
        "decisions: hold 1, redrive 5; redrives: redriven 5",
        "decisions: hold 1; redrives: none",
    ]
    [left] = await queue.dead_letters(0)
    assert left.job_id == corrupt
    assert await audit_actions(redis, queue, corrupt) == ["held"]
    await redis.xdel(queue.keys.dead_letters(0), left.entry_id)
    await redriven_once(redis, queue, [j for j in job_ids if j != corrupt])
