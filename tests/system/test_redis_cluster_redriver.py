"""The redriver and `splatq dlq` / `splatq tasks` on a Redis Cluster of three primaries (and
three replicas): dead letters on every node are listed and redriven by hand, a `splatq
redriver` process sweeps the rest by policy, and `expire_records` -- SCAN on each primary in
turn, checkpointed per node -- gives every record that lost its TTL one again."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import orjson
import pytest
from redis.asyncio import Redis

from splatq.shared.engine.jobs import JobSpec
from splatq.shared.engine.queue import JobQueue
from splatq.shared.maintenance.housekeeping import ExpireRecords
from splatq.shared.maintenance.schedule import Schedule
from splatq.shared.maintenance.scheduler import TaskRun
from splatq.shared.redis.cluster_server import LocalCluster
from splatq.shared.testing import engine_settings, eventually
from tests.cluster import (
    cluster_client,
    dead_letter_a_job,
    needs_redis_cli,
    redis_cluster,
    splatq_cli,
    stack_env,
)
from tests.maintenance.helpers import audit_actions
from tests.system.conftest import SpawnService

__all__ = ["cluster_client", "redis_cluster"]  # fixtures
pytestmark = [pytest.mark.slow, needs_redis_cli]
PARTITIONS = 6
EVERY_SECOND = """
[rate_limit]
per_s = 1000
burst = 1000

[[policies]]
name = "poison-retry"
kind = "jobs"
codes = ["max_deliveries_exceeded"]
action = "redrive"
budget = 3

[tasks.redrive_sweep]
schedule = "* * * * * *"

[tasks.expire_records]
schedule = "* * * * * *"
""" + "".join(
    f"\n[tasks.{name}]\nenabled = false\n"
    for name in ("retention", "prune_consumers", "stream_bounds", "expired_leases")
)


class Checkpoints:
    """A task run's checkpoint, without the scheduler's lock (to start a run mid-way)."""

    def __init__(self, checkpoint: str) -> None:
        self.checkpoint = checkpoint
        self.saved: list[str] = []

    async def save(self, checkpoint: str) -> None:
        self.saved.append(checkpoint)
        self.checkpoint = checkpoint


async def records_without_ttl(redis: Redis, queue: JobQueue) -> dict[str, list[str]]:
    """Completed job records and their idempotency claims with no TTL, until every primary
    holds some; node name -> keys."""
    by_node: dict[str, list[str]] = {}
    for i in range(200):
        if len(by_node) == 3 and min(map(len, by_node.values())) >= 2:
            return by_node
        result = await queue.enqueue(
            JobSpec(tenant="acme", quality="preview", idempotency_key=f"key-{i}")
        )
        job = await queue.get(result.job_id)
        assert job is not None
        for key in (queue.keys.job(job.id), job.claim_key):
            if key == queue.keys.job(job.id):
                await redis.hset(key, "status", "completed")  # type: ignore[misc]
            await redis.persist(key)
            node = cast("str", redis.get_node_from_key(key).name)  # type: ignore[attr-defined]
            by_node.setdefault(node, []).append(key)
    raise AssertionError(f"records on {sorted(by_node)} only")


async def ttls(redis: Redis, keys: list[str]) -> list[int]:
    return [int(await redis.pttl(k)) for k in keys]


async def test_expire_records_scans_every_primary_and_resumes_per_node(
    redis_cluster: LocalCluster, cluster_client: Redis
) -> None:
    queue = JobQueue(cluster_client, engine_settings(redis_cluster.url, partitions=PARTITIONS))
    await queue.setup()
    by_node = await records_without_ttl(cluster_client, queue)
    first, second, third = sorted(by_node)
    task = ExpireRecords(queue, Schedule("41 * * * *"), batch=5)

    # A run resumed after the second node was done covers only the third.
    run = Checkpoints(f"{second}|0")
    summary = await task.run(cast("TaskRun", run))
    assert summary.startswith(f"{len(by_node[third])} records given a TTL on 3 primaries")
    assert all(t > 0 for t in await ttls(cluster_client, by_node[third]))
    assert set(await ttls(cluster_client, by_node[first] + by_node[second])) == {-1}
    assert {c.split("|")[0] for c in run.saved} == {third}
    assert run.saved[-1] == f"{third}|0"

    # From the start: every primary, in name order, each to its cursor 0.
    run = Checkpoints("")
    summary = await task.run(cast("TaskRun", run))
    assert summary.startswith(
        f"{len(by_node[first]) + len(by_node[second])} records given a TTL on 3 primaries"
    )
    everything = [k for keys in by_node.values() for k in keys]
    assert all(t > 0 for t in await ttls(cluster_client, everything))
    done = [c for c in run.saved if c.endswith("|0")]
    assert done == [f"{first}|0", f"{second}|0", f"{third}|0"]


async def test_splatq_dlq_and_the_redriver_process_on_three_primaries(
    redis_cluster: LocalCluster, cluster_client: Redis, spawn_service: SpawnService,
    tmp_path: Path,
) -> None:  # fmt: skip
    url = redis_cluster.url
    queue = JobQueue(cluster_client, engine_settings(url, partitions=PARTITIONS))
    await queue.setup()
    dead = [await dead_letter_a_job(queue) for _ in range(4)]
    stale = [k for keys in (await records_without_ttl(cluster_client, queue)).values()
             for k in keys]  # fmt: skip
    config = tmp_path / "redriver.toml"
    config.write_text(EVERY_SECOND)
    env = stack_env(tmp_path, PARTITIONS, SPLATQ_REDRIVER_CONFIG=str(config))

    # By hand: every node's dead letters listed, one redriven.
    code, out, err = await splatq_cli(url, env, "dlq", "list", "--json")
    assert code == 0, err
    entries = orjson.loads(out)
    assert sorted(e["job_id"] for e in entries) == sorted(dead)
    assert {e["reason"] for e in entries} == {"max_deliveries_exceeded"}
    by_hand = entries[0]
    code, out, err = await splatq_cli(url, env, "dlq", "redrive", by_hand["id"], "--json")
    assert (code, orjson.loads(out)[0]["outcome"]) == (0, "redriven"), err

    # By policy and by schedule: a redriver process sweeps the rest and expires records.
    spawn_service("redriver", url, SPLATQ_TASK_POLL_MS="50", SPLATQ_TASK_LOCK_TTL_MS="3000",
                  **env)  # fmt: skip

    async def swept() -> bool:
        letters = [e for p in range(PARTITIONS) for e in await queue.dead_letters(p)]
        jobs = [await queue.get(j) for j in dead]
        expired = all(t > 0 for t in await ttls(cluster_client, stale))
        return not letters and expired and all(j and j.status == "queued" for j in jobs)

    await eventually(swept, timeout=60, interval=0.2)
    for job_id in dead:
        assert await audit_actions(cluster_client, queue, job_id) == ["redriven"]
    code, out, err = await splatq_cli(url, env, "tasks", "history", "expire_records", "--json")
    assert code == 0, err
    runs = orjson.loads(out)
    assert any(r["outcome"] == "success" and "on 3 primaries" in r["summary"] for r in runs), runs
    code, out, err = await splatq_cli(url, env, "tasks", "history", "redrive_sweep", "--json")
    assert code == 0, err
    assert any("redriven 3" in r["summary"] for r in orjson.loads(out)), out
