"""`splatq dlq`: list, show, redrive and purge dead-lettered jobs, as an operator would."""

from __future__ import annotations

import asyncio
import sys

import orjson
import pytest
from redis.asyncio import Redis

from splatq.shared.engine.keys import StreamName
from splatq.shared.engine.queue import JobQueue
from splatq.shared.engine.reaper import Reaper
from splatq.shared.redis.server import RedisServer
from splatq.shared.testing import WorkerFactory, eventually, service_env, wait_for_status
from splatq.shared.webhooks.store import AttemptResult, Recorded, WebhookStore
from tests.helpers import REPO_ROOT, spec

pytestmark = pytest.mark.slow
COMPLETED = "3d_reconstruction.completed"


async def splatq_dlq(redis_url: str, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "splatq.services.cli",
        "dlq",
        *args,
        cwd=REPO_ROOT,
        env=service_env(redis_url),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def _dead_letter_a_job(queue: JobQueue, redis: Redis) -> str:
    """A job whose worker died with its last allowed charge: the reaper dead-letters it."""
    job_id = (await queue.enqueue(spec(order="X-1"))).job_id
    [taken] = await queue.take(0, {StreamName.INTERACTIVE: 1}, 1, "dead-worker")
    assert taken.outcome == "started"
    await redis.delete(queue.keys.lease(job_id))
    # Its earlier deaths (alone on its worker) already charged all but the last one.
    await redis.hset(
        queue.keys.job(job_id), "delivery_charge", str(queue.settings.max_deliveries - 1)
    )
    reaper = Reaper(queue, "reaper", 0.0)

    async def dead() -> bool:
        await reaper.reap_stale_entries(0, StreamName.INTERACTIVE, 5)
        job = await queue.get(job_id)
        return job is not None and job.status == "failed"

    await eventually(dead, timeout=10, interval=0.2)
    return job_id


async def test_list_show_redrive_and_the_job_completes(
    queue: JobQueue, redis: Redis, redis_server: RedisServer, start_worker: WorkerFactory
) -> None:
    """A dead-lettered job is listed with its reason, shown, left alone by --dry-run, and
    redriven: queued again with deliveries reset, then completed by a worker."""
    job_id = await _dead_letter_a_job(queue, redis)
    failed = await queue.get(job_id)
    assert failed is not None
    assert failed.error is not None
    assert failed.error.code == "dead_lettered"

    code, out, _ = await splatq_dlq(redis_server.url, "list", "--json")
    assert code == 0
    [entry] = orjson.loads(out)
    assert (entry["job_id"], entry["reason"]) == (job_id, "max_deliveries_exceeded")

    code, out, _ = await splatq_dlq(redis_server.url, "show", entry["id"])
    assert code == 0
    assert orjson.loads(out)["fields"]["charge"] == f"{queue.settings.max_deliveries:.2f}"

    code, out, _ = await splatq_dlq(redis_server.url, "redrive", "--all", "--dry-run", "--json")
    assert code == 0
    assert orjson.loads(out)[0]["outcome"] == "would_redrive"
    assert (await queue.get(job_id)).status == "failed"  # type: ignore[union-attr]

    code, out, _ = await splatq_dlq(redis_server.url, "redrive", entry["id"], "--json")
    assert code == 0, out
    assert orjson.loads(out)[0]["outcome"] == "redriven"
    queued = await queue.get(job_id)
    assert queued is not None
    assert (queued.status, queued.deliveries, queued.error) == ("queued", 0, None)
    assert await redis.xlen(queue.keys.dead_letters(0)) == 0
    await start_worker()
    done = await wait_for_status(queue, job_id, {"completed"})
    assert done.metadata == {"order": "X-1"}


async def test_malformed_entries_cannot_be_redriven_but_can_be_purged(
    queue: JobQueue, redis: Redis, redis_server: RedisServer, start_worker: WorkerFactory
) -> None:
    """An entry with no job is refused by redrive (exit 3) and removed by purge; filters
    by --code select entries; a bad id is a usage error."""
    await redis.xadd(queue.keys.stream(0, StreamName.INTERACTIVE), {"garbage": "1"})
    good = await queue.enqueue(spec())
    await start_worker()
    await wait_for_status(queue, good.job_id, {"completed"})
    code, out, _ = await splatq_dlq(redis_server.url, "list", "--code", "missing_fields", "--json")
    assert code == 0
    [entry] = orjson.loads(out)
    code, out, _ = await splatq_dlq(redis_server.url, "redrive", entry["id"], "--json")
    assert code == 3
    assert orjson.loads(out)[0]["outcome"] == "not_redrivable"
    code, _, _ = await splatq_dlq(redis_server.url, "list", "--code", "unknown_job")
    assert code == 1
    code, _, err = await splatq_dlq(redis_server.url, "show", "not-an-id")
    assert code == 3
    assert "not a dead-letter id" in err
    code, out, _ = await splatq_dlq(redis_server.url, "purge", "--all", "--json")
    assert code == 0
    assert orjson.loads(out)[0]["outcome"] == "purged"
    assert await redis.xlen(queue.keys.dead_letters(0)) == 0


async def _dead_letter_a_webhook_message(queue: JobQueue, code: str) -> str:
    """A message that failed for good (as the dispatcher records a 410): returns its id."""
    job_id = (await queue.enqueue(spec())).job_id
    store = WebhookStore(queue)
    message_id = f"evt_{code}:job"
    fields = {"id": message_id, "event_id": f"evt_{code}", "event_type": COMPLETED,
              "job_id": job_id, "tenant": "acme", "url": "https://93.184.216.34/h",
              "payload": "{}", "target": "job", "created_ms": "1"}  # fmt: skip
    await store.fan_out(0, [("0-1", [fields])])
    [message] = await store.claim_due(0, 1, 60_000)
    [recorded] = await store.record_many(
        [
            AttemptResult(
                message,
                "failed",
                0,
                {"outcome": "failed", "status_code": 410},
                "HTTP 410",
                code=code,
            )
        ]
    )
    assert isinstance(recorded, Recorded)
    assert recorded.status == "failed"
    return message_id


async def test_webhook_dead_letters_are_listed_redriven_and_purged(
    queue: JobQueue, redis: Redis, redis_server: RedisServer
) -> None:
    """`--kind webhooks`: a failed message is listed by code, redriven (pending again, due
    now, a fresh attempt budget) and a second one purged; jobs' dead letters are separate."""
    gone = await _dead_letter_a_webhook_message(queue, "gone")
    refused = await _dead_letter_a_webhook_message(queue, "refused")
    code, out, _ = await splatq_dlq(redis_server.url, "list", "--kind", "webhooks", "--json")
    assert code == 0
    assert sorted(e["reason"] for e in orjson.loads(out)) == ["gone", "refused"]
    code, _, _ = await splatq_dlq(redis_server.url, "list", "--json")
    assert code == 1  # no job dead letters

    code, out, _ = await splatq_dlq(
        redis_server.url, "list", "--kind", "webhooks", "--code", "gone", "--json"
    )
    [entry] = orjson.loads(out)
    assert entry["fields"]["message"] == gone
    code, out, _ = await splatq_dlq(
        redis_server.url, "show", "--kind", "webhooks", entry["id"], "--json"
    )
    assert code == 0
    shown = orjson.loads(out)
    assert shown["fields"]["target"] == "job"
    assert shown["attempts"] == [{"outcome": "failed", "status_code": 410}]
    code, out, _ = await splatq_dlq(
        redis_server.url, "redrive", "--kind", "webhooks", entry["id"], "--json"
    )
    assert code == 0, out
    assert orjson.loads(out)[0]["outcome"] == "redriven"
    message = await redis.hgetall(queue.keys.webhook_message(0, gone))
    assert (message["status"], message["attempts"]) == ("pending", "0")
    assert await redis.zscore(queue.keys.webhook_due(0), gone) is not None
    assert await redis.ttl(queue.keys.webhook_message(0, gone)) == -1  # kept until delivered

    code, out, _ = await splatq_dlq(
        redis_server.url, "purge", "--kind", "webhooks", "--all", "--json"
    )
    assert code == 0
    assert [r["outcome"] for r in orjson.loads(out)] == ["purged"]
    assert await redis.xlen(queue.keys.webhook_dead_letters(0)) == 0
    assert (await redis.hget(queue.keys.webhook_message(0, refused), "status")) == "failed"


async def test_redrive_from_stage_runs_that_stage_and_later_ones_again(
    queue: JobQueue,
    redis: Redis,
    redis_server: RedisServer,
    storage: object,
    start_stages: object,
    settings: object,
) -> None:
    """A staged job dead-lettered in `render`: `splatq dlq redrive --from-stage export` runs
    export, render and publish again and skips ingest and reconstruct (their ledger)."""
    from splatq.shared.engine.jobs import JobSpec  # noqa: PLC0415
    from splatq.shared.engine.stages import PipelineStage  # noqa: PLC0415
    from tests.stage_handlers import ToyStages, work_key  # noqa: PLC0415

    toy = ToyStages(storage)  # type: ignore[arg-type]
    codes = frozenset({"RENDER_BROKE"})
    await start_stages(toy, "all", dead_letter_codes=codes)  # type: ignore[operator]
    q = JobQueue(redis, queue.settings.with_overrides(dead_letter_codes=codes))
    job_id = (
        await q.enqueue(
            JobSpec(tenant="acme", quality="preview", metadata={"fail": {"render": "RENDER_BROKE"}})
        )
    ).job_id
    await wait_for_status(q, job_id, {"failed"})
    code, out, err = await splatq_dlq(redis_server.url, "list", "--json")
    [letter] = [x for x in orjson.loads(out) if x["job_id"] == job_id]
    code, out, err = await splatq_dlq(
        redis_server.url, "redrive", letter["id"], "--from-stage", "export", "--json"
    )
    assert code == 0, err
    assert orjson.loads(out)[0]["outcome"] == "redriven"
    job = await wait_for_status(q, job_id, {"completed", "failed"})
    assert job.status.value == "completed", job.error
    runs = {
        s.value: int(await redis.get(work_key(job_id, s.value)) or 0)
        for s in PipelineStage
        if s is not PipelineStage.CLEANUP
    }
    assert runs == {"ingest": 1, "reconstruct": 1, "export": 2, "render": 1, "publish": 1}
    code, _, err = await splatq_dlq(redis_server.url, "redrive", "--all", "--from-stage", "nope")
    assert code == 2, err  # argparse refuses an unknown stage
