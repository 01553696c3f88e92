"""Idempotency does not depend on routing (issue #21, item 7): with several partitions, a
tenant's running cap moves its new jobs and claims to its home partition. The same
Idempotency-Key -- or the same content, for single-flight and the cache -- answers with the
same job after the cap is set or removed, and no second job is made anywhere."""

from __future__ import annotations

import re
from typing import Any

from aiohttp.test_utils import TestClient
from redis.asyncio import Redis

from splatq.services.gateway.images import validate_image
from splatq.services.gateway.result_cache import content_key
from splatq.shared.engine.events import EventType
from splatq.shared.engine.fairness import home_partition
from splatq.shared.engine.ids import partition_of
from splatq.shared.engine.keys import KeySchema
from splatq.shared.engine.queue import Finish, JobQueue
from splatq.shared.settings import Settings
from tests.gateway import corpus
from tests.gateway.conftest import AUTH_A, ClientFactory
from tests.gateway.test_api import form

Client = TestClient[Any, Any]
ADMIN_KEY = "admin-secret-key-0123456789-abcdefghijkl"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
PREVIEW = {"quality": "preview"}
PARTITIONS = 4
HOME = home_partition("acme", PARTITIONS)
KEYS = KeySchema(partitions=PARTITIONS)
JOB_KEY = re.compile(r"splatq:\{p\d+\}:job:job_\d{3}[0-9A-Z]{26}")


async def _client(make_client: ClientFactory) -> Client:
    # no policy cache: an admin change governs the very next submission
    return await make_client(admin_api_key=ADMIN_KEY, partitions=PARTITIONS, api_key_cache_s=0.0)


async def _set_cap(client: Client, cap: int) -> None:
    resp = await client.patch(
        "/v1/admin/tenants/acme", json={"running_caps": {"interactive": cap}}, headers=ADMIN
    )
    assert resp.status == 200, await resp.text()


def _idem_key_off_home(avoid: str = "") -> str:
    """An Idempotency-Key whose own partition is not acme's home partition."""
    for i in range(100):
        key = f"order-{i}"
        if key != avoid and KEYS.partition_for(f"idempotency:acme:{key}") != HOME:
            return key
    raise AssertionError("no key off the home partition")


def _png_off_home(settings: Settings, avoid: bytes = b"") -> bytes:
    """An image whose content key (single-flight, cache) has its own partition off home."""
    model_id = f"{settings.model}:{settings.model_checkpoint}"
    for w in range(20, 80):
        png = corpus.valid_png(w, 20)
        key = content_key("acme", validate_image(png).sha256, "preview", model_id, 0, False)
        if png != avoid and KEYS.partition_for(key) != HOME:
            return png
    raise AssertionError("no image off the home partition")


async def _jobs(redis: Redis) -> list[str]:
    return [k async for k in redis.scan_iter("splatq:*:job:*") if JOB_KEY.fullmatch(k)]


async def _submit(client: Client, png: bytes, key: str = "") -> tuple[int, str]:
    headers = {**AUTH_A, "Idempotency-Key": key} if key else AUTH_A
    resp = await client.post("/v1/jobs", data=form(png, PREVIEW), headers=headers)
    assert resp.status in (200, 202), await resp.text()
    return resp.status, str((await resp.json())["id"])


async def test_the_same_key_finds_its_job_after_a_cap_is_set_and_removed(
    make_client: ClientFactory, redis: Redis
) -> None:
    client = await _client(make_client)
    png = corpus.valid_png(30, 30)
    # uncapped: the job lives with its key; then a cap moves the tenant home
    key = _idem_key_off_home()
    status, first = await _submit(client, png, key)
    assert status == 202
    assert partition_of(first) != HOME
    await _set_cap(client, 3)
    assert await _submit(client, png, key) == (202, first)
    assert await _jobs(redis) == [f"splatq:{{p{partition_of(first)}}}:job:{first}"]
    # capped: the job lives home; then the cap is removed and the key routes to its own
    other = _idem_key_off_home(avoid=key)
    status, second = await _submit(client, png, other)
    assert status == 202
    assert partition_of(second) == HOME
    await _set_cap(client, 0)
    assert await _submit(client, png, other) == (202, second)
    assert await _submit(client, png, key) == (202, first)
    assert len(await _jobs(redis)) == 2


async def test_single_flight_and_the_cache_find_their_job_across_a_cap_change(
    make_client: ClientFactory, redis: Redis, settings: Settings
) -> None:
    """Without an Idempotency-Key the content key routes the same way: an identical submission
    joins the job made before the cap changed, and once that job completed it is the cache's
    answer (200) -- not a second run."""
    client = await _client(make_client)
    png = _png_off_home(settings)
    status, first = await _submit(client, png)
    assert status == 202
    assert partition_of(first) != HOME
    await _set_cap(client, 3)
    assert await _submit(client, png) == (202, first)  # single-flight
    assert len(await _jobs(redis)) == 1
    # the job completes; the identical submission is answered from the cache
    queue = JobQueue(redis, settings.with_overrides(partitions=PARTITIONS))
    taken = [t for t in await queue.take(partition_of(first), {}, 1, "w1") if t.job is not None]
    assert [t.job.id for t in taken if t.job is not None] == [first]
    t = taken[0]
    await queue.finish_many(
        [
            Finish(
                first,
                t.entry.stream,
                t.entry.entry_id,
                t.token,
                "completed",
                claim_key=t.entry.fields.get("claim", ""),
                event=EventType.COMPLETED.value,
            )
        ]
    )
    assert await _submit(client, png) == (200, first)
    # the reverse: made under the cap (home), found once the cap is gone
    other = _png_off_home(settings, avoid=png)
    status, second = await _submit(client, other)
    assert status == 202
    assert partition_of(second) == HOME
    await _set_cap(client, 0)
    assert await _submit(client, other) == (202, second)
    assert len(await _jobs(redis)) == 2
