"""The fleet-wide vendor lane's scripts against a real redis-server: GCRA rate, leased slots,
first-come order, the shared pause, the circuit breaker, resends, one slot per vendor."""

from __future__ import annotations

import asyncio
import time

import pytest
from redis.asyncio import Redis
from redis.crc import key_slot

from splatq.shared.redis.client import connect
from splatq.shared.redis.server import RedisServer
from splatq.shared.vendor.keys import VendorKeys
from splatq.shared.vendor.limiter import NotYet, Permit, VendorLane, gcra, new_permit_id
from tests.vendor.conftest import vendor_config


def lane(redis: Redis, **limits: object) -> VendorLane:
    defaults: dict[str, object] = {"rate": 600, "per_s": 60, "concurrency": 3, "slot_ttl_s": 10}
    return VendorLane(redis, vendor_config(limits={**defaults, **limits}))


async def take(v: VendorLane, member: str, tenant: str = "t", ticket: int = 0) -> Permit | NotYet:
    return await v.acquire(member, tenant, new_permit_id(), ticket or int(time.time() * 1000))


def test_gcra_keeps_any_window_within_the_vendors_rate() -> None:
    """The earliest arrivals GCRA admits (t0 + kT - tau) never put more than `rate` of them
    in any window of the vendor's length, even arriving half the tolerance early."""
    for rate, per_s, safety in [(60, 60, 0.97), (5, 1, 0.95), (1, 60, 0.97), (600, 60, 0.99)]:
        interval, tau = gcra(rate, per_s, safety)
        assert interval == pytest.approx(per_s * 1000 / (rate * safety))
        window = per_s * 1000
        earliest = [0.0] + [k * interval - 2 * tau for k in range(1, 3 * rate + 2)]
        worst = max(sum(1 for t in earliest if s <= t < s + window) for s in earliest)
        assert worst <= rate, (rate, per_s, worst)


async def test_concurrency_slots_are_shared_by_every_process(redis_server: RedisServer) -> None:
    """Three lanes on three connections (three processes) share 3 slots: the 4th waits for
    `slots`, and gets one once a holder releases."""
    clients = [connect(redis_server.url) for _ in range(3)]
    await clients[0].flushall()
    try:
        lanes = [lane(c, concurrency=3) for c in clients]
        got = [await take(lanes[i], f"job{i}:full", ticket=1 + i) for i in range(3)]
        assert all(isinstance(g, Permit) for g in got), got
        fourth = await take(lanes[0], "job3:full", ticket=4)
        assert isinstance(fourth, NotYet)
        assert fourth.reason == "slots"
        await lanes[1].release("job1:full", "t")
        assert isinstance(await take(lanes[2], "job3:full", ticket=4), Permit)
    finally:
        for c in clients:
            await c.aclose()


async def test_a_killed_holders_slot_comes_back_after_its_lease(redis: Redis) -> None:
    """A slot nobody renews lapses after slot_ttl_s; a renewal keeps it; a renewal never
    brings back a released slot; an adoption takes one even past the limit."""
    v = lane(redis, concurrency=1, slot_ttl_s=1)
    assert isinstance(await take(v, "a:full", ticket=1), Permit)
    assert isinstance(await take(v, "b:full", ticket=2), NotYet)
    await asyncio.sleep(0.6)
    assert await v.hold("a:full", "t")  # renewed: good for another second
    await asyncio.sleep(0.6)
    assert isinstance(await take(v, "b:full", ticket=2), NotYet)
    await asyncio.sleep(1.1)  # a's holder died: nobody renewed
    assert isinstance(await take(v, "b:full", ticket=2), Permit)
    await v.release("b:full", "t")
    assert not await v.hold("b:full", "t")  # renewing a released slot: stays released
    assert await redis.zcard(v.keys.slots) == 0
    assert isinstance(await take(v, "c:full", ticket=3), Permit)
    assert await v.hold("a:full", "t", adopt=True)  # a prediction running at the vendor
    assert await redis.zcard(v.keys.slots) == 2


async def test_the_rate_is_fleet_wide_and_nearly_all_of_it_is_used(
    redis_server: RedisServer,
) -> None:
    """Four lanes (processes) with 5 callers each against 10/s: no 1 s window holds more than
    10 grants, and the grants come at >= 0.9 of the rate."""
    clients = [connect(redis_server.url) for _ in range(4)]
    await clients[0].flushall()
    grants: list[float] = []
    stop = time.monotonic() + 2.5

    async def caller(v: VendorLane, name: str) -> None:
        ticket = int(time.time() * 1000)
        while time.monotonic() < stop:
            got = await v.acquire(name, "t", new_permit_id(), ticket)
            if isinstance(got, Permit):
                grants.append(time.monotonic())
                await v.release(name, "t")
                ticket = int(time.time() * 1000)
            else:
                await asyncio.sleep(got.delay_ms / 1000)

    try:
        lanes = [lane(c, rate=10, per_s=1, concurrency=50) for c in clients]
        await asyncio.gather(*(caller(v, f"j{i}{k}:full") for i, v in enumerate(lanes)
                               for k in range(5)))  # fmt: skip
    finally:
        for c in clients:
            await c.aclose()
    grants.sort()
    worst = max(sum(1 for t in grants if start <= t < start + 1.0) for start in grants)
    assert worst <= 10, worst
    achieved = (len(grants) - 1) / (grants[-1] - grants[0])
    assert achieved >= 0.9 * 10 * 0.97, achieved


async def test_a_resent_acquire_takes_one_token(redis: Redis) -> None:
    """A lost reply's resend (same permit id) answers `held` and takes no second token."""
    v = lane(redis, rate=1, per_s=60, concurrency=5)
    permit = new_permit_id()
    first = await v.acquire("a:full", "t", permit, 1)
    assert first == Permit("new")
    assert await v.acquire("a:full", "t", permit, 1) == Permit("held")
    other = await take(v, "b:full", ticket=2)
    assert isinstance(other, NotYet)
    assert other.reason == "rate"
    assert other.delay_ms > 50_000  # the next token is a minute away: only one was taken


async def test_waiters_are_served_oldest_first(redis: Redis) -> None:
    """With one slot, the waiter with the oldest ticket gets it, whoever asks first."""
    v = lane(redis, concurrency=1)
    assert isinstance(await take(v, "holder:full", ticket=1), Permit)
    for name, ticket in [("young:full", 300), ("old:full", 100), ("mid:full", 200)]:
        assert isinstance(await take(v, name, ticket=ticket), NotYet)
    await v.release("holder:full", "t")
    assert isinstance(await take(v, "young:full", ticket=300), NotYet)
    assert isinstance(await take(v, "mid:full", ticket=200), NotYet)
    assert isinstance(await take(v, "old:full", ticket=100), Permit)


async def test_a_waiter_that_stops_asking_leaves_the_head_of_the_line(redis: Redis) -> None:
    """A waiter whose process died blocks the line only until it is stale (5 s): then the
    next one is served."""
    v = lane(redis, concurrency=1)
    assert isinstance(await take(v, "holder:full", ticket=5), Permit)
    assert isinstance(await take(v, "dead:full", ticket=1), NotYet)  # in line, then dies
    await v.release("holder:full", "t")
    assert isinstance(await take(v, "alive:full", ticket=9), NotYet)  # dead is ahead of it
    await redis.hset(v.keys.seen, "dead:full", int(time.time() * 1000) - 6000)
    assert isinstance(await take(v, "alive:full", ticket=9), Permit)


async def test_a_slow_down_pauses_the_whole_lane(redis_server: RedisServer) -> None:
    """One process's 429 (Retry-After) pauses every process's next permit until then, and
    the rate does not burst after it."""
    a, b = connect(redis_server.url), connect(redis_server.url)
    await a.flushall()
    try:
        la, lb = lane(a), lane(b)
        until = int(time.time() * 1000) + 800
        await la.report("slow_down", "x:full", new_permit_id(), until)
        got = await take(lb, "y:full", ticket=1)
        assert isinstance(got, NotYet)
        assert got.reason == "paused"
        assert abs(got.until_ms - until) < 5
        await asyncio.sleep(0.85)
        assert isinstance(await take(lb, "y:full", ticket=1), Permit)
        assert float(await a.get(la.keys.rate) or 0) >= until
    finally:
        await a.aclose()
        await b.aclose()


async def test_the_circuit_opens_probes_and_closes(redis: Redis) -> None:
    """3 consecutive failures open the circuit (every acquire answers `open`); after open_s
    one probe is let through; its failure re-opens for twice as long; a success closes it. A
    resent report counts once."""
    v = lane(redis)
    rid = new_permit_id()
    await v.report("failure", "a:full", rid)
    await v.report("failure", "a:full", rid)  # the same report resent: not counted again
    assert (await v.report("failure", "b:full", new_permit_id())).state == "closed"
    opened = await v.report("failure", "c:full", new_permit_id())
    assert opened.state == "open"
    assert opened.opened
    got = await take(v, "d:full", ticket=1)
    assert isinstance(got, NotYet)
    assert got.reason == "open"
    await asyncio.sleep(max(0, got.until_ms / 1000 - time.time()) + 0.05)
    probe = await take(v, "d:full", ticket=1)
    assert probe == Permit("probe")
    assert isinstance(await take(v, "e:full", ticket=2), NotYet)  # one probe at a time
    again = await v.report("failure", "d:full", new_permit_id())
    assert again.opened
    assert again.open_until_ms - time.time() * 1000 > 1500
    await v.release("d:full", "t")
    await redis.hset(v.keys.breaker, "open_until", 0)  # skip the wait
    assert await take(v, "e:full", ticket=2) == Permit("probe")
    closed = await v.report("success", "e:full", new_permit_id())
    assert closed.state == "closed"
    assert isinstance(await take(v, "f:full", ticket=3), Permit)


async def test_a_tenant_at_its_own_limit_holds_up_no_other_tenant(redis: Redis) -> None:
    """Per-tenant concurrency within the vendor: tenant A at its 1 slot waits; B, younger,
    still gets a slot of the vendor's."""
    v = lane(redis, concurrency=5, tenant_concurrency=1)
    assert isinstance(await take(v, "a1:full", "A", 1), Permit)
    blocked = await take(v, "a2:full", "A", 2)
    assert isinstance(blocked, NotYet)
    assert blocked.reason == "tenant_slots"
    assert isinstance(await take(v, "b1:full", "B", 3), Permit)


def test_every_key_of_a_vendor_is_in_one_cluster_slot() -> None:
    """The lane's scripts are cluster-safe: all their keys hash to the vendor's slot."""
    k = VendorKeys("replicate")
    keys = [k.slots, k.holders, k.rate, k.waiting, k.seen, k.pause, k.breaker,
            k.reported("x"), k.inbox("p1"), *k.tenant_keys("acme"), *k.tenant_keys("")]  # fmt: skip
    assert len({key_slot(key.encode()) for key in keys}) == 1
