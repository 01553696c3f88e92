"""The dispatcher's cache of tenants' signing secrets: one lookup for concurrent first uses,
fresh after its period, and a failed lookup forgotten."""

from __future__ import annotations

import asyncio

import pytest

from splatq.services.webhook_dispatcher.secret_cache import SecretCache


async def test_concurrent_uses_share_one_lookup_and_the_period_expires() -> None:
    calls: list[str] = []

    async def lookup(tenant: str) -> tuple[str, ...]:
        calls.append(tenant)
        await asyncio.sleep(0.01)
        return (f"whsec_{len(calls)}",)

    cache = SecretCache(lookup, ttl_s=0.05)
    first = await asyncio.gather(*(cache.get("acme") for _ in range(10)))
    assert first == [("whsec_1",)] * 10
    assert calls == ["acme"]
    await asyncio.sleep(0.06)
    assert await cache.get("acme") == ("whsec_2",)  # a rotation shows after the period


async def test_a_failed_lookup_is_asked_again() -> None:
    answers = iter([RuntimeError("redis away"), ("whsec_ok",)])

    async def lookup(tenant: str) -> tuple[str, ...]:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    cache = SecretCache(lookup, ttl_s=60)
    with pytest.raises(RuntimeError):
        await cache.get("acme")
    assert await cache.get("acme") == ("whsec_ok",)
