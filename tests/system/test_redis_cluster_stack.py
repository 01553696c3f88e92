"""The whole stack on a Redis Cluster of three primaries and three replicas: a gateway, two
workers and the webhook dispatcher as processes, six partitions spread over the primaries.
Jobs, SSE, artifact downloads, webhooks to a job's URL and to a registered endpoint, the
endpoints API and both kinds of dead letters (`splatq dlq`) all work as on one Redis."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import orjson
import pytest
from redis.asyncio import Redis

from splatq.services.webhook_dispatcher.policy import endpoint_wants, should_deliver
from splatq.shared.engine.ids import partition_of
from splatq.shared.engine.queue import JobQueue
from splatq.shared.redis.cluster_server import LocalCluster
from splatq.shared.storage.store import ARTIFACT_FILES
from splatq.shared.testing import engine_settings, eventually
from tests.cluster import (
    COMPLETED,
    Api,
    Receiver,
    cluster_client,
    dead_letter_a_job,
    needs_redis_cli,
    redis_cluster,
    splatq_cli,
    stack_env,
    start_stack,
    wait_ready,
)
from tests.handlers import artifact_bytes
from tests.system.conftest import SpawnService, SpawnWorker

__all__ = ["cluster_client", "redis_cluster"]  # fixtures
pytestmark = [pytest.mark.slow, needs_redis_cli]
PARTITIONS = 6
JOBS = 12


async def expected_deliveries(
    redis: Redis, queue: JobQueue, job_ids: set[str], endpoint_events: tuple[str, ...]
) -> set[tuple[str, str]]:
    """(receiver path, event id) of every delivery the outbox calls for: each event of the
    jobs to their webhook_url ('job', no filter: everything), and the endpoint's events."""
    expected = set()
    for p in range(PARTITIONS):
        for _, f in await redis.xrange(queue.keys.events(p)):
            if f.get("job_id") not in job_ids:
                continue
            if should_deliver(f["type"], ()):
                expected.add(("job", f["event_id"]))
            if endpoint_wants(f["type"], endpoint_events):
                expected.add(("endpoint", f["event_id"]))
    return expected


async def test_the_whole_stack_on_three_primaries_and_three_replicas(
    redis_cluster: LocalCluster,
    cluster_client: Redis,
    spawn_service: SpawnService,
    spawn_worker: SpawnWorker,
    tmp_path: Path,
) -> None:
    url = redis_cluster.url
    env = stack_env(tmp_path, PARTITIONS)
    queue = JobQueue(cluster_client, engine_settings(url, partitions=PARTITIONS))
    await queue.setup()
    dead_job = await dead_letter_a_job(queue)  # before any worker runs
    receiver = Receiver(refuse={"flaky"})
    await receiver.start()
    try:
        base = await start_stack(spawn_service, spawn_worker, url, env)
        async with aiohttp.ClientSession() as http:
            api = Api(http, base)
            await wait_ready(api)
            status, endpoint = await api.call(
                "POST", "/v1/webhook-endpoints",
                json={"url": receiver.url("endpoint"), "events": [COMPLETED]},
            )  # fmt: skip
            assert status == 201, endpoint
            job_ids = []
            for n in range(JOBS):
                # The first job's worker writes artifact files the gateway then serves.
                meta = {"artifacts": "1"} if n == 0 else None
                status, job_id = await api.submit(n, receiver.url("job"), meta)
                assert status == 202, job_id
                job_ids.append(job_id)
            assert len({partition_of(j) for j in job_ids}) > 1
            status, flaky_job = await api.submit(JOBS, receiver.url("flaky"))
            assert status == 202

            # SSE follows a job to its end.
            assert (await api.sse_events(job_ids[0]))[-1] == COMPLETED

            async def all_completed() -> bool:
                return (await api.statuses([*job_ids, flaky_job]))["completed"] == JOBS + 1

            await eventually(all_completed, timeout=60, interval=0.2)
            expected = await expected_deliveries(cluster_client, queue, set(job_ids), (COMPLETED,))
            assert ("endpoint", (await api.job(job_ids[0]))["id"]) not in expected  # sanity

            async def all_delivered() -> bool:
                return expected <= set(receiver.counts(job_ids))

            await eventually(all_delivered, timeout=60, interval=0.2)

            # Artifact downloads: the job record (its artifact_run) read through the cluster.
            for name in ARTIFACT_FILES:
                status, body = await api.download(job_ids[0], name)
                assert (status, body) == (200, artifact_bytes(job_ids[0], name))
            assert (await api.download(job_ids[0], "nope"))[0] == 404

            # The endpoints API and the job's delivery log.
            status, listed = await api.call("GET", "/v1/webhook-endpoints")
            assert status == 200
            assert [e["id"] for e in listed["data"]] == [endpoint["id"]]
            status, rotated = await api.call(
                "POST", f"/v1/webhook-endpoints/{endpoint['id']}/rotate-secret"
            )
            assert status == 200, rotated
            status, recovered = await api.call(
                "POST", f"/v1/webhook-endpoints/{endpoint['id']}/recover",
                json={"since": "2020-01-01T00:00:00Z"},
            )  # fmt: skip
            assert status == 202, recovered
            status, log = await api.call("GET", f"/v1/jobs/{job_ids[0]}/deliveries")
            assert status == 200
            assert {d["target"] for d in log["deliveries"]} == {"job", endpoint["id"]}

            # Webhook dead letters: the flaky receiver answered 410 (failed for good).
            async def flaky_dead_lettered() -> bool:
                code, out, _ = await splatq_cli(url, env, "dlq", "list", "--kind", "webhooks",
                                                "--json")  # fmt: skip
                return code == 0 and COMPLETED in {e["fields"]["event"] for e in orjson.loads(out)}

            await eventually(flaky_dead_lettered, timeout=30, interval=0.5)
            receiver.refuse.clear()
            code, out, err = await splatq_cli(
                url, env, "dlq", "redrive", "--kind", "webhooks", "--all", "--json"
            )
            assert code == 0, out + err
            assert {r["outcome"] for r in orjson.loads(out)} == {"redriven"}

            async def flaky_delivered() -> bool:
                return any(who == "flaky" and event == COMPLETED
                           for who, _, event, _ in receiver.deliveries)  # fmt: skip

            await eventually(flaky_delivered, timeout=30, interval=0.2)

            # Job dead letters: listed, shown, redriven; a worker completes the job.
            code, out, err = await splatq_cli(url, env, "dlq", "list", "--json")
            assert code == 0, err
            [entry] = orjson.loads(out)
            assert (entry["job_id"], entry["reason"]) == (dead_job, "max_deliveries_exceeded")
            code, out, err = await splatq_cli(url, env, "dlq", "show", entry["id"], "--json")
            assert code == 0, err
            code, out, err = await splatq_cli(url, env, "dlq", "redrive", entry["id"], "--json")
            assert (code, orjson.loads(out)[0]["outcome"]) == (0, "redriven"), err

            async def redriven_job_done() -> bool:
                return (await api.job(dead_job))["status"] == "completed"

            await eventually(redriven_job_done, timeout=30, interval=0.2)
        # Exactly once per (event, target): nothing was lost and nothing crashed here.
        counts = receiver.counts(job_ids)
        assert {k: n for k, n in counts.items() if n > 1} == {}
        assert set(counts) == expected
    finally:
        await receiver.close()
