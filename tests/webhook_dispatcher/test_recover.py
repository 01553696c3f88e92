"""`recover` reads only its endpoint's webhook dead letters, through the per-(tenant, target)
index that wh_result.lua and wh_redrive.lua keep: the work of one call does not grow with
other endpoints' dead letters; purged or trimmed entries are not sent again; dead letters
from before the index are indexed once by the dispatcher's setup."""

from __future__ import annotations

import time
from typing import Any

from redis.asyncio import Redis

from splatq.shared.engine.queue import JobQueue
from splatq.shared.webhooks.endpoints import EndpointStore
from splatq.shared.webhooks.store import AttemptResult, WebhookStore

COMPLETED = "3d_reconstruction.completed"
BATCH = 500


async def _dead_letters(queue: JobQueue, tenant: str, target: str, event_ids: list[str]) -> None:
    """Messages to `target` failed for good, recorded as the dispatcher records them (in
    batches: fan-out, claim, result)."""
    store = WebhookStore(queue)
    for start in range(0, len(event_ids), BATCH):
        chunk = event_ids[start : start + BATCH]
        fields = [
            {
                "id": f"{e}:{target}",
                "event_id": e,
                "event_type": COMPLETED,
                "job_id": "job_000" + "0" * 26,
                "tenant": tenant,
                "url": "",
                "payload": "{}",
                "target": target,
                "created_ms": "1",
            }
            for e in chunk
        ]
        await store.fan_out(0, [("0-1", fields)])
        messages = await store.claim_due(0, len(fields), 60_000)
        assert len(messages) == len(chunk)
        await store.record_many(
            [AttemptResult(m, "failed", 0, {}, "x", code="exhausted") for m in messages]
        )


async def _server_stats(redis: Redis) -> tuple[int, int]:
    """(bytes Redis has sent to clients, commands it has run, scripts' own included)."""
    stats: dict[str, Any] = await redis.info("stats")
    commands: dict[str, Any] = await redis.info("commandstats")
    calls = sum(int(v["calls"]) for k, v in commands.items() if k.startswith("cmdstat_"))
    return int(stats["total_net_output_bytes"]), calls


async def _due(redis: Redis, queue: JobQueue) -> list[str]:
    return sorted(await redis.zrange(queue.keys.webhook_due(0), 0, -1))


async def test_recover_reads_only_its_endpoints_dead_letters(queue: JobQueue, redis: Redis) -> None:
    """With 2,000 dead letters of other endpoints (another endpoint of the tenant, the same
    endpoint id of another tenant, the tenant's job webhooks) and 3 of this one, recover sends
    exactly those 3 again, and Redis sends back a few KiB over a few dozen commands, not the
    other endpoints' entries."""
    store = EndpointStore(queue)
    ep = await store.create("acme", "https://93.184.216.34/h", [])
    other = await store.create("acme", "https://93.184.216.34/o", [])
    since_ms = int(time.time() * 1000) - 1000
    await _dead_letters(queue, "acme", ep.id, ["evt_a0"])
    await _dead_letters(queue, "acme", other.id, [f"evt_o{i}" for i in range(1000)])
    await _dead_letters(queue, "beta", ep.id, [f"evt_b{i}" for i in range(500)])
    await _dead_letters(queue, "acme", "job", [f"evt_j{i}" for i in range(500)])
    await _dead_letters(queue, "acme", ep.id, ["evt_a1", "evt_a2"])
    dlq = queue.keys.webhook_dead_letters(0)
    assert await redis.xlen(dlq) == 2003

    bytes_before, calls_before = await _server_stats(redis)
    result = await store.recover("acme", ep.id, since_ms)
    bytes_after, calls_after = await _server_stats(redis)

    assert (result.recovered, result.expired, result.truncated) == (3, 0, False)
    assert await _due(redis, queue) == [f"evt_a{i}:{ep.id}" for i in range(3)]
    assert await redis.xlen(dlq) == 2000
    # The old scan read every entry since `since` (~400 bytes each, ~800 KiB here).
    assert bytes_after - bytes_before < 16 * 1024
    assert calls_after - calls_before < 60
    again = await store.recover("acme", ep.id, since_ms)
    assert (again.recovered, again.truncated) == (0, False)


async def test_purged_redriven_or_trimmed_dead_letters_are_not_recovered(
    queue: JobQueue, redis: Redis
) -> None:
    """Of four dead letters of an endpoint, one purged and one redriven by the operator and
    one trimmed from the stream (MAXLEN): recover sends only the fourth again, and leaves
    the endpoint's index empty."""
    store = EndpointStore(queue)
    webhooks = WebhookStore(queue)
    ep = await store.create("acme", "https://93.184.216.34/h", [])
    await _dead_letters(queue, "acme", ep.id, [f"evt_{i}" for i in range(4)])
    letters = {d.fields["event_id"]: d for d in await webhooks.dead_letters(0)}
    assert await webhooks.purge_dead_letter(letters["evt_0"])
    assert (await webhooks.redrive(letters["evt_1"]))[0] == "redriven"
    await redis.xdel(queue.keys.webhook_dead_letters(0), letters["evt_2"].entry_id)

    result = await store.recover("acme", ep.id, 0)

    assert (result.recovered, result.expired, result.truncated) == (1, 0, False)
    assert await _due(redis, queue) == [f"evt_1:{ep.id}", f"evt_3:{ep.id}"]
    assert await redis.xlen(queue.keys.webhook_dead_letters(0)) == 0
    assert await redis.zcard(queue.keys.webhook_dead_letter_index(0, "acme", ep.id)) == 0


async def test_dead_letters_from_before_the_index_are_indexed_at_setup(
    queue: JobQueue, redis: Redis
) -> None:
    """Dead letters written before the index existed (no index, no marker) are indexed by
    WebhookStore.setup, once, and then recovered."""
    store = EndpointStore(queue)
    ep = await store.create("acme", "https://93.184.216.34/h", [])
    await _dead_letters(queue, "acme", ep.id, ["evt_0", "evt_1"])
    await _dead_letters(queue, "acme", "job", ["evt_j"])
    index = queue.keys.webhook_dead_letter_index(0, "acme", ep.id)
    indexed = await redis.zrange(index, 0, -1, withscores=True)
    assert len(indexed) == 2
    await redis.delete(
        index,
        queue.keys.webhook_dead_letter_index(0, "acme", "job"),
        queue.keys.webhook_dead_letters_indexed(0),
    )

    await WebhookStore(queue).setup()

    assert await redis.zrange(index, 0, -1, withscores=True) == indexed
    assert await redis.zcard(queue.keys.webhook_dead_letter_index(0, "acme", "job")) == 1
    result = await store.recover("acme", ep.id, 0)
    assert (result.recovered, result.truncated) == (2, False)
