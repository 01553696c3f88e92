"""Tenants, API keys and the quota saga's steps against a real redis-server."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest
from redis.asyncio import Redis
from redis.crc import key_slot

from splatq.shared.engine.keys import StreamName
from splatq.shared.tenants.apikeys import key_hash
from splatq.shared.tenants.periods import Period, window
from splatq.shared.tenants.quota import QuotaBook, ReleaseReason
from splatq.shared.tenants.store import TenantError, TenantStore

JOB_A = "job_00001JD0000000000000000000A"
JOB_B = "job_00001JD0000000000000000000B"


async def test_keys_are_stored_hashed_looked_up_rotated_and_revoked(redis: Redis) -> None:
    store = TenantStore(redis)
    await store.create("acme", weight=3, caps={StreamName.SYNTHESIS: 2})
    with pytest.raises(TenantError) as exists:
        await store.create("acme")
    assert exists.value.code == "tenant_exists"
    first = await store.add_key("acme", label="ci")
    assert (await store.lookup(first.api_key)).tenant == "acme"  # type: ignore[union-attr]
    # Redis holds the key's hash, never the key itself.
    dump = [str(await redis.dump(k)) async for k in redis.scan_iter("*")]
    assert not any(first.api_key in d for d in dump)
    assert await redis.hexists(store.keys.key_hashes, key_hash(first.api_key))  # type: ignore[misc]
    # A rotation with a grace: the old key works until the grace ends, the new one at once.
    second = await store.add_key("acme", retire=first.info.key_id, retire_after_s=3600)
    assert (await store.lookup(first.api_key)) is not None
    assert (await store.lookup(second.api_key)).tenant == "acme"  # type: ignore[union-attr]
    third = await store.add_key("acme", retire=second.info.key_id, retire_after_s=0)
    assert await store.lookup(second.api_key) is None  # retired at once
    await store.revoke_key("acme", third.info.key_id)
    assert await store.lookup(third.api_key) is None
    with pytest.raises(TenantError):
        await store.revoke_key("acme", third.info.key_id)
    with pytest.raises(TenantError):
        await store.add_key("nobody")
    assert (await store.scheduling("acme")).weight == 3
    assert (await store.scheduling("acme")).running_cap(StreamName.SYNTHESIS) == 2
    assert (await store.scheduling_many(["acme", "other"]))["other"].weight == 1


async def test_bad_tenant_ids_are_refused(redis: Redis) -> None:
    for bad in ("", "a{b}", "a:b", "x" * 65, "-lead", "sp ace"):
        with pytest.raises(TenantError):
            await TenantStore(redis).create(bad)


async def test_every_step_happens_once(redis: Redis) -> None:
    book = QuotaBook(redis)
    await TenantStore(redis).set_quota("acme", 100, Period.DAY)
    first = await book.reserve("acme", JOB_A, 30_000)
    again = await book.reserve("acme", JOB_A, 30_000)  # a resend: not reserved twice
    assert (first.outcome, again.outcome) == ("reserved", "exists")
    assert (await book.usage("acme")).reserved_ms == 30_000
    units = {"ingest.aa": 345, "reconstruct.bb": 12_000}
    charged = await book.charge("acme", JOB_A, units, "completed")
    assert charged.done
    assert charged.amount_ms == 12_345
    # a resend, or the same event read again: every unit is charged already
    assert not (await book.charge("acme", JOB_A, units, "completed")).done
    assert not (await book.release("acme", JOB_A, ReleaseReason.FAILED)).done  # closed
    usage = await book.usage("acme")
    assert (usage.reserved_ms, usage.used_ms) == (0, 12_345)
    assert await book.charged_units("acme", JOB_A) == units
    # a second end (redriven, then completed) charges only the units it adds
    more = {**units, "export.cc": 55}
    assert (await book.charge("acme", JOB_A, more, "completed")).amount_ms == 55
    assert (await book.usage("acme")).used_ms == 12_400
    # a waived end: the reservation goes back once, nothing is charged; the job redriven and
    # completed is charged its units then (reused work counts when it is used)
    await book.reserve("acme", JOB_B, 30_000)
    assert (await book.release("acme", JOB_B, ReleaseReason.FAILED)).amount_ms == 30_000
    assert not (await book.release("acme", JOB_B, ReleaseReason.FAILED)).done
    assert (await book.charge("acme", JOB_B, {"job": 1_000}, "completed")).done
    usage = await book.usage("acme")
    assert (usage.reserved_ms, usage.used_ms) == (0, 13_400)
    # a job that never reserved is neither charged nor recorded
    never = "job_00001JD0000000000000000000C"
    assert not (await book.charge("acme", never, {"job": 5_000}, "completed")).done
    assert await book.ledger("acme", never) == {}


async def test_reserve_refuses_past_the_quota_and_writes_nothing(redis: Redis) -> None:
    book = QuotaBook(redis)
    await TenantStore(redis).set_quota("acme", 50, Period.MONTH)
    assert (await book.reserve("acme", JOB_A, 40_000)).granted
    refused = await book.reserve("acme", JOB_B, 20_000)
    assert refused.outcome == "exceeded"
    assert (refused.usage.limit_ms, refused.usage.reserved_ms) == (50_000, 40_000)
    assert refused.usage.resets_ms == window(Period.MONTH, int(time.time() * 1000)).resets_ms
    assert await book.ledger("acme", JOB_B) == {}
    assert list(await book.open_reservations("acme")) == [JOB_A]


def test_periods_reset_at_utc_boundaries() -> None:
    at = int(datetime(2026, 12, 31, 23, 59, tzinfo=UTC).timestamp() * 1000)
    day, month = window(Period.DAY, at), window(Period.MONTH, at)
    assert (day.id, month.id) == ("d2026-12-31", "m2026-12")
    assert (
        day.resets_ms == month.resets_ms == int(datetime(2027, 1, 1, tzinfo=UTC).timestamp() * 1000)
    )


def test_each_script_touches_one_slot() -> None:
    from splatq.shared.tenants.keys import TenantKeys  # noqa: PLC0415

    k = TenantKeys()
    tenant_keys = [k.quota("t"), k.reservations("t"), k.saga("t", JOB_A), k.usage("t", "d1"),
                   k.settings("t")]  # fmt: skip
    assert len({key_slot(x.encode()) for x in tenant_keys}) == 1
    registry = [k.index, k.key_hashes, k.tenant_keys("t")]
    assert len({key_slot(x.encode()) for x in registry}) == 1
