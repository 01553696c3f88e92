"""The result cache over real HTTP and Redis: fresh until the soft TTL, stale (answered at once,
`stale: true`, one background refresh for any number of identical hits) until the hard TTL, a
miss after it; keys versioned by the model/backend version; purge by version; counters."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp.test_utils import TestClient
from redis.asyncio import Redis

from splatq.shared.engine.job_context import JobContext
from splatq.shared.engine.jobs import JobOutcome
from splatq.shared.engine.queue import JobQueue
from splatq.shared.testing import WorkerFactory, wait_for_status
from tests.gateway.conftest import ADMIN, AUTH_A, ClientFactory
from tests.gateway.test_api import form

Client = TestClient[Any, Any]
TTLS = {"cache_soft_ttl_s": 60, "cache_hard_ttl_s": 600}


class Gated:
    """Completes each job as soon as its gate is open (tests hold a refresh job running)."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.gate.set()

    async def __call__(self, ctx: JobContext) -> JobOutcome:
        await self.gate.wait()
        return JobOutcome(compute_time_ms=1)


async def _submit(client: Client) -> tuple[int, dict[str, Any]]:
    resp = await client.post("/v1/jobs", data=form(params={"quality": "preview"}), headers=AUTH_A)
    return resp.status, await resp.json()


async def _age(redis: Redis, queue: JobQueue, job_id: str, seconds: int) -> None:
    """Make a completed job's result `seconds` old (its completion time is what the cache
    judges by)."""
    key = queue.keys.job(job_id)
    completed = int(await redis.hget(key, "completed_at_ms") or 0)
    await redis.hset(key, "completed_at_ms", completed - seconds * 1000)


async def _jobs(redis: Redis) -> int:
    return len(
        [
            k
            async for k in redis.scan_iter("splatq:*:job:*")
            if not k.endswith((":events", ":h", ":wake"))
        ]
    )


async def _lookups(client: Client) -> dict[str, float]:
    text = await (await client.get("/metrics", headers=ADMIN)).text()
    out = {}
    for line in text.splitlines():
        if line.startswith("splatq_cache_lookups_total{"):
            result = line.split('result="', 1)[1].split('"', 1)[0]
            out[result] = float(line.rsplit(" ", 1)[1])
    return out


async def test_stale_hits_are_answered_at_once_and_refresh_once(
    make_client: ClientFactory, queue: JobQueue, redis: Redis, start_worker: WorkerFactory
) -> None:
    """Past the soft TTL, 100 concurrent identical submissions are all answered 200 from the
    cache with `stale: true`, and make exactly one refresh job; once it completed, the next
    one is a fresh hit on the refresh's result. The lookups are counted."""
    client = await make_client(**TTLS)
    status, first = await _submit(client)
    assert status == 202
    handler = Gated()
    await start_worker(handler)
    await wait_for_status(queue, first["id"], {"completed"})
    status, hit = await _submit(client)
    assert (status, hit["id"], hit["cached"], hit["stale"]) == (200, first["id"], True, False)
    await _age(redis, queue, first["id"], 61)
    handler.gate.clear()  # the refresh runs until the burst is over
    answers = await asyncio.gather(*(_submit(client) for _ in range(100)))
    assert {(s, b["id"], b["cached"], b["stale"]) for s, b in answers} == {
        (200, first["id"], True, True)
    }
    assert await _jobs(redis) == 2  # the original and one refresh
    keys = [
        k
        async for k in redis.scan_iter("splatq:*:job:*")
        if not k.endswith((":events", ":h", ":wake"))
    ]
    [refresh_id] = [k.rsplit(":", 1)[1] for k in keys if not k.endswith(first["id"])]
    handler.gate.set()
    await wait_for_status(queue, refresh_id, {"completed"})
    status, fresh = await _submit(client)
    assert (status, fresh["id"], fresh["cached"], fresh["stale"]) == (200, refresh_id, True, False)
    counts = await _lookups(client)
    assert counts["stale"] == 100
    assert counts["hit"] == 2
    assert counts["miss"] == 1


async def test_past_the_hard_ttl_it_is_a_miss_computed_once(
    make_client: ClientFactory, queue: JobQueue, redis: Redis, start_worker: WorkerFactory
) -> None:
    """A result older than the hard TTL is never served: identical submissions make one new
    job (single-flight), answered 202 like any new job."""
    client = await make_client(**TTLS)
    _, first = await _submit(client)
    handler = Gated()
    await start_worker(handler)
    await wait_for_status(queue, first["id"], {"completed"})
    await _age(redis, queue, first["id"], 601)
    handler.gate.clear()  # the new job runs until the burst is over
    answers = await asyncio.gather(*(_submit(client) for _ in range(10)))
    ids = {b["id"] for _, b in answers}
    assert len(ids) == 1
    assert first["id"] not in ids
    assert {s for s, _ in answers} == {202}
    [new_id] = ids
    handler.gate.set()
    await wait_for_status(queue, new_id, {"completed"})
    status, hit = await _submit(client)
    assert (status, hit["id"], hit["stale"]) == (200, new_id, False)


async def test_cache_keys_follow_the_backend_version_and_purge_by_version(
    make_client: ClientFactory, queue: JobQueue, redis: Redis, start_worker: WorkerFactory
) -> None:
    """Another model version never answers from this one's results; purging a version makes
    its results misses (and only its own)."""
    client = await make_client(**TTLS)
    _, first = await _submit(client)
    await start_worker()
    await wait_for_status(queue, first["id"], {"completed"})
    upgraded = await make_client(model_checkpoint="/weights/v2.pt", **TTLS)
    status, other = await _submit(upgraded)
    assert (status, other["cached"]) == (202, False)
    await wait_for_status(queue, other["id"], {"completed"})

    info = await (await client.get("/v1/admin/cache", headers=ADMIN)).json()
    assert info == {"version": "builtin:", "generation": 0, "soft_ttl_s": 60, "hard_ttl_s": 600}
    purged = await client.post("/v1/admin/cache/purge", json={"version": "builtin:"}, headers=ADMIN)
    assert purged.status == 200
    assert (await purged.json())["generation"] == 1
    status, again = await _submit(client)
    assert (status, again["cached"]) == (202, False)
    assert again["id"] != first["id"]
    status, still = await _submit(upgraded)  # the other version's results are untouched
    assert (status, still["id"], still["cached"]) == (200, other["id"], True)
    bad = await client.post("/v1/admin/cache/purge", json={"version": ""}, headers=ADMIN)
    assert bad.status == 400
    assert (await client.post("/v1/admin/cache/purge", json={}, headers=AUTH_A)).status == 403
