"""The Redis settings splatq's memory figures assume: the servers it starts use them, and a
server that differs is named at the gateway's start."""

from __future__ import annotations

from redis.asyncio import Redis

from splatq.shared.redis import tuning


def test_differences_name_a_low_listpack_value_and_accept_enough() -> None:
    assert tuning.differences({"hash-max-listpack-value": "1024"}) == []
    assert tuning.differences({"hash-max-listpack-value": "8192"}) == []
    assert tuning.differences({}) == []  # a server that does not say: nothing to report
    (problem,) = tuning.differences({"hash-max-listpack-value": "64"})
    assert problem.startswith("hash-max-listpack-value is 64, not 1024")


async def test_the_servers_splatq_starts_keep_a_staged_record_compact(redis: Redis) -> None:
    assert await tuning.check(redis) == []
    ledger = '{"status":"succeeded","attempts":1,"digest":"' + "d" * 64 + '","work_ms":12}'
    await redis.hset("splatq:{p0}:job:job_x", mapping={"status": "completed", "ps.ingest": ledger})
    assert await redis.object("encoding", "splatq:{p0}:job:job_x") == "listpack"
    await redis.config_set("hash-max-listpack-value", 64)
    try:
        (problem,) = await tuning.check(redis)
        assert "hash-max-listpack-value is 64" in problem
    finally:
        await redis.config_set("hash-max-listpack-value", 1024)
