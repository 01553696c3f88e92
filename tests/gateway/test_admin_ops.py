"""The operator endpoints the console reads, over loopback HTTP against the session's
redis-server: /v1/admin/stats (streams, throughput, the worker processes with their cards and
leases, dead-letter depths), dead letters (list, show with the death log, redrive, purge: both
audited as the person acting) and the scheduled tasks; admin key only; answers valid against
the OpenAPI document."""

from __future__ import annotations

from typing import Any

from aiohttp.test_utils import TestClient
from redis.asyncio import Redis

from splatq.services.gateway.ops_stats import count_events
from splatq.shared.engine.queue import DeadLetter, JobQueue
from splatq.shared.maintenance.deadletters import DeadLetterBook
from splatq.shared.maintenance.keys import DeadLetterKind
from splatq.shared.testing import WorkerFactory, eventually
from tests.gateway.conftest import AUTH_A, ClientFactory
from tests.gateway.test_api import problem
from tests.gateway.test_openapi import _check
from tests.helpers import spec
from tests.maintenance.helpers import dead_letter_jobs

Client = TestClient[Any, Any]
ADMIN_KEY = "admin-ops-key-0123456789-abcdefghijklmn"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


async def dead_letter_a_job(queue: JobQueue, redis: Redis) -> str:
    """A job whose worker died with the job's last allowed charge: the reaper dead-letters it
    (tests/maintenance/helpers.py)."""
    [job_id] = await dead_letter_jobs(queue, redis)
    return job_id


async def admin_client(make_client: ClientFactory) -> Client:
    return await make_client(admin_api_key=ADMIN_KEY)


async def test_stats_show_streams_throughput_and_a_live_worker_with_its_leases(
    make_client: ClientFactory, queue: JobQueue, start_worker: WorkerFactory
) -> None:
    client = await admin_client(make_client)
    done = (await queue.enqueue(spec())).job_id
    await start_worker(worker_concurrency=3)

    async def completed() -> bool:
        job = await queue.get(done)
        return job is not None and job.status == "completed"

    await eventually(completed, timeout=10)
    held = (await queue.enqueue(spec(sleep_s=5))).job_id  # running while we look

    async def seen() -> dict[str, Any]:
        stats: dict[str, Any] = await (await client.get("/v1/admin/stats", headers=ADMIN)).json()
        return stats

    async def leased() -> bool:
        workers = (await seen())["workers"]
        return bool(workers and workers[0]["leases"] and workers[0]["running"] == 1)

    await eventually(leased, timeout=10)
    stats = await seen()
    _check(stats, "AdminStats")
    [worker] = stats["workers"]
    assert worker["slots"] == 3
    assert worker["stages"] == ["job"]  # a whole-job worker
    assert worker["running"] == 1
    assert [(x["stage"], x["stream"], x["leases"]) for x in worker["leases"]] == [
        ("ingest", "interactive", 1)
    ]
    entry = {(r["stage"], r["stream"]): r for r in stats["streams"]}
    assert entry["ingest", "interactive"]["running"] == 1
    assert stats["throughput"]["jobs"]["completed"] == 1
    assert stats["dead_letters"] == {"jobs": 0, "webhooks": 0}
    await queue.cancel(held, "acme")


def test_throughput_counts_stage_successes_and_outcomes() -> None:
    progress = '{"data":{"stage":"%s","stage_status":"%s"}}'
    stages, jobs = count_events(
        [
            ("3d_reconstruction.progress", progress % ("ingest", "succeeded")),
            ("3d_reconstruction.progress", progress % ("reconstruct", "running")),
            ("3d_reconstruction.progress", progress % ("reconstruct", "succeeded")),
            ("3d_reconstruction.progress", '{"data":{"progress":0.5}}'),
            ("3d_reconstruction.completed", "{}"),
            ("3d_reconstruction.failed", "{}"),
        ]
    )
    assert stages == {"ingest": 1, "reconstruct": 1, "publish": 1}
    assert jobs == {"completed": 1, "failed": 1}


async def test_dead_letters_list_show_redrive_and_purge_are_audited(
    make_client: ClientFactory, queue: JobQueue, redis: Redis
) -> None:
    client = await admin_client(make_client)
    first = await dead_letter_a_job(queue, redis)
    second = await dead_letter_a_job(queue, redis)
    page = await (await client.get("/v1/admin/dead-letters/jobs", headers=ADMIN)).json()
    _check(page, "DeadLetterPage")
    assert page["total"] == 2
    assert [x["subject"] for x in page["items"]] == [second, first]  # newest first
    assert page["items"][0]["tenant"] == "acme"
    assert page["items"][0]["error"]["code"] == "dead_lettered"
    entry_id = page["items"][1]["id"]

    shown = await (
        await client.get(f"/v1/admin/dead-letters/jobs/{entry_id}", headers=ADMIN)
    ).json()
    _check(shown, "DeadLetter")
    assert shown["reason"] == "max_deliveries_exceeded"
    assert [e["type"].rsplit(".", 1)[1] for e in shown["job"]["events"]] == [
        "queued", "started", "failed"
    ]  # fmt: skip
    assert shown["audit"] == []

    resp = await client.post(
        f"/v1/admin/dead-letters/jobs/{entry_id}/redrive", json={"actor": "ada"}, headers=ADMIN
    )
    assert resp.status == 200, await resp.text()
    assert (await resp.json())["outcome"] == "redriven"
    assert (await queue.get(first)).status == "queued"  # type: ignore[union-attr]
    await problem(
        await client.get(f"/v1/admin/dead-letters/jobs/{entry_id}", headers=ADMIN), 404, "not_found"
    )
    other = page["items"][0]["id"]
    resp = await client.post(f"/v1/admin/dead-letters/jobs/{other}/purge", headers=ADMIN)
    assert resp.status == 204
    await problem(
        await client.post(f"/v1/admin/dead-letters/jobs/{other}/purge", headers=ADMIN),
        404,
        "not_found",
    )
    book = DeadLetterBook(queue)
    gone = DeadLetter(0, entry_id.split("/")[1], {"job": first})
    [record] = await book.audit_trail(DeadLetterKind.JOBS, gone)
    assert (record["action"], record["actor"], record["why"]) == (
        "redriven", "person:ada", "console redrive"
    )  # fmt: skip
    purged = DeadLetter(0, other.split("/")[1], {"job": second})
    [record] = await book.audit_trail(DeadLetterKind.JOBS, purged)
    assert (record["action"], record["actor"]) == ("purged", "person:console")


async def test_dead_letter_requests_are_checked(make_client: ClientFactory, queue: JobQueue,
                                                redis: Redis) -> None:  # fmt: skip
    client = await admin_client(make_client)
    await dead_letter_a_job(queue, redis)
    [letter] = await queue.dead_letters(0)
    url = f"/v1/admin/dead-letters/jobs/{letter.id}"
    for bad in ({"from_stage": "nowhere"}, {"actor": ""}, {"actor": "x" * 65}, {"extra": 1}):
        await problem(await client.post(f"{url}/redrive", json=bad, headers=ADMIN), 400,
                      "invalid_request")  # fmt: skip
    await problem(await client.post(f"{url}/purge", json={"from_stage": "export"}, headers=ADMIN),
                  400, "invalid_request")  # fmt: skip
    base = "/v1/admin/dead-letters"
    for path in (f"{base}/things", f"{base}/jobs/7/1-0", f"{base}/jobs/0/1-0",
                 f"{base}/jobs/0/x-y"):  # fmt: skip
        await problem(await client.get(path, headers=ADMIN), 404, "not_found")
    await problem(
        await client.get("/v1/admin/dead-letters/jobs?limit=0", headers=ADMIN), 400,
        "invalid_request",
    )  # fmt: skip
    # a tenant's key is not the admin key; no key is no one
    for path in ("/v1/admin/stats", "/v1/admin/tasks", "/v1/admin/dead-letters/jobs", url):
        await problem(await client.get(path, headers=AUTH_A), 403, "forbidden")
        await problem(await client.get(path), 401, "unauthorized")
    await problem(await client.post(f"{url}/redrive", headers=AUTH_A), 403, "forbidden")
    assert await queue.dead_letters(0) != []  # nothing was done


async def test_tasks_show_schedules_and_history(
    make_client: ClientFactory, queue: JobQueue
) -> None:
    client = await admin_client(make_client)
    body = await (await client.get("/v1/admin/tasks", headers=ADMIN)).json()
    _check(body, "ScheduledTasks")
    assert body["config"] == "(defaults)"
    names = {t["task"] for t in body["tasks"]}
    assert {"retention", "expire_records", "prune_consumers"} <= names
    assert all(t["next_run"] for t in body["tasks"] if t["enabled"])
    assert all(t["history"] == [] for t in body["tasks"])
