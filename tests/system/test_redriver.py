"""`splatq redriver` processes against a real redis-server: two replicas run each scheduled slot
exactly once, and a run SIGKILLed mid-sweep is resumed from its checkpoint by the other
replica once the lock's TTL has passed, redriving nothing twice."""

from __future__ import annotations

import asyncio
import itertools
import signal
import sys
import time
from pathlib import Path

import orjson
import pytest
from redis.asyncio import Redis

from splatq.shared.engine.queue import JobQueue
from splatq.shared.maintenance.keys import MaintenanceKeys
from splatq.shared.redis.server import RedisServer
from splatq.shared.testing import eventually, service_env
from tests.helpers import REPO_ROOT
from tests.maintenance.helpers import audit_actions, dead_letter_jobs, write_config
from tests.system.conftest import SpawnService

pytestmark = pytest.mark.slow
EVERY_SECOND = """
[tasks.stream_bounds]
schedule = "* * * * * *"
""" + "".join(
    f"[tasks.{name}]\nenabled = false\n"
    for name in ("redrive_sweep", "retention", "expire_records", "prune_consumers",
                 "expired_leases")
)  # fmt: skip


async def test_two_replicas_run_each_slot_exactly_once(
    redis: Redis, queue: JobQueue, redis_server: RedisServer, spawn_service: SpawnService,
    tmp_path: Path,
) -> None:  # fmt: skip
    config = tmp_path / "redriver.toml"
    config.write_text(EVERY_SECOND)
    env = {"SPLATQ_REDRIVER_CONFIG": str(config), "SPLATQ_TASK_POLL_MS": "50",
           "SPLATQ_TASK_LOCK_TTL_MS": "2000"}  # fmt: skip
    replicas = [spawn_service("redriver", redis_server.url, **env) for _ in range(2)]
    history_key = MaintenanceKeys(queue.keys).task_history("stream_bounds")

    async def six_runs() -> bool:
        assert all(p.poll() is None for p in replicas)
        return int(await redis.xlen(history_key)) >= 6

    await eventually(six_runs, timeout=30, interval=0.1)
    runs = [f for _, f in await redis.xrange(history_key)]
    slots = [int(r["slot_ms"]) for r in runs]
    assert len(slots) == len(set(slots)), slots  # no slot ran twice
    assert all(r["outcome"] == "success" for r in runs)
    spans = sorted((int(r["started_ms"]), int(r["finished_ms"])) for r in runs)
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start >= end  # never two runs of the task at once
    assert all(s % 1000 == 0 for s in slots)  # on the second, UTC


async def test_a_run_killed_mid_sweep_resumes_from_its_checkpoint(
    redis: Redis, queue: JobQueue, redis_server: RedisServer, spawn_service: SpawnService,
    tmp_path: Path,
) -> None:  # fmt: skip
    job_ids = await dead_letter_jobs(queue, redis, count=30)
    # 10 redrives/s in batches of 3: the sweep takes about 3 s, checkpointing every batch.
    config = write_config(tmp_path / "p.toml", rate=10, burst=1, batch=3, budget=5)
    ttl_ms = 1500
    env = {"SPLATQ_REDRIVER_CONFIG": str(config), "SPLATQ_TASK_POLL_MS": "50",
           "SPLATQ_TASK_LOCK_TTL_MS": str(ttl_ms)}  # fmt: skip
    keys = MaintenanceKeys(queue.keys)
    first = spawn_service("redriver", redis_server.url, **env)

    async def mid_run() -> bool:
        assert first.poll() is None
        left = int(await redis.xlen(queue.keys.dead_letters(0)))
        return 6 <= len(job_ids) - left <= 20

    await eventually(mid_run, timeout=30, interval=0.02)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=10)
    killed_ms = int(time.time() * 1000)
    state = await redis.hgetall(keys.task_state("redrive_sweep"))
    assert state["running"] == "1"
    assert state["checkpoint"]
    left_at_kill = int(await redis.xlen(queue.keys.dead_letters(0)))
    second = spawn_service("redriver", redis_server.url, **env)

    async def finished() -> bool:
        assert second.poll() is None
        return int(await redis.xlen(keys.task_history("redrive_sweep"))) >= 1

    await eventually(finished, timeout=40, interval=0.1)
    [(_, run)] = await redis.xrange(keys.task_history("redrive_sweep"))
    assert run["outcome"] == "success"
    assert run["resumed_from"]  # it started from the dead holder's checkpoint
    assert int(run["started_ms"]) >= killed_ms  # only after the dead holder's lock expired
    assert int(await redis.xlen(queue.keys.dead_letters(0))) == 0
    assert left_at_kill > 0
    for job_id in job_ids:  # each redriven exactly once, and it says so
        assert await redis.hget(queue.keys.job(job_id), "redrives") == "1", job_id
        assert await audit_actions(redis, queue, job_id) == ["redriven"], job_id


async def test_dry_run_and_a_persons_redrive_show_in_the_audit_trail(
    redis: Redis, queue: JobQueue, redis_server: RedisServer, tmp_path: Path
) -> None:
    [job_id] = await dead_letter_jobs(queue, redis)
    config = write_config(tmp_path / "p.toml", budget=1)
    url = redis_server.url
    env = {"SPLATQ_REDRIVER_CONFIG": str(config)}
    code, out, err = await splatq(url, env, "redriver", "--dry-run", "--json")
    assert code == 0, err
    [row] = orjson.loads(out)
    assert (row["verdict"], row["policy"]) == ("redrive", "poison-retry")
    assert await redis.xlen(queue.keys.dead_letters(0)) == 1  # a dry run does nothing
    code, _, err = await splatq(url, env, "dlq", "redrive", row["id"], "--as", "alice")
    assert code == 0, err
    await dead_letter_jobs(queue, redis, [job_id])
    [(entry_id, _)] = await redis.xrange(queue.keys.dead_letters(0))
    code, out, err = await splatq(url, env, "dlq", "show", f"0/{entry_id}", "--json")
    assert code == 0, err
    [audit] = orjson.loads(out)["audit"]
    assert (audit["action"], audit["actor"]) == ("redriven", "person:alice")
    code, out, _ = await splatq(url, env, "redriver", "--dry-run", "--json")
    assert orjson.loads(out)[0]["verdict"] == "exhausted"  # alice's redrive spent the budget


async def splatq(redis_url: str, env: dict[str, str], *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "splatq.services.cli", *args,
        cwd=REPO_ROOT, env=service_env(redis_url, **env),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()
