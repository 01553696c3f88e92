"""The retry policies of shared/redis/retry.py: which failures each resends. Plain callables
stand in for the Redis call here: what is tested is the policy (the kinds of error, the
budget), not Redis; the paths through a real redis-server are in test_faults.py."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from splatq.shared.redis.retry import read_while_unavailable, while_refused


def _failing(*errors: Exception) -> tuple[list[int], Callable[[], Awaitable[str]]]:
    calls: list[int] = []

    async def call() -> str:
        calls.append(1)
        if len(calls) <= len(errors):
            raise errors[len(calls) - 1]
        return "answer"

    return calls, call


async def test_a_read_is_read_again_after_a_lost_connection_and_a_not_now_reply() -> None:
    calls, call = _failing(RedisConnectionError("reset"), ResponseError("TRYAGAIN migrating"))
    assert await read_while_unavailable(call, 5.0, "test") == "answer"
    assert len(calls) == 3


async def test_a_write_is_not_resent_after_a_lost_connection() -> None:
    """A lost reply may follow a write that ran: only a read may be sent again blindly."""
    calls, call = _failing(RedisConnectionError("reset"))
    with pytest.raises(RedisConnectionError):
        await while_refused(call, 5.0, "test")
    assert len(calls) == 1


async def test_an_error_that_is_not_transient_is_raised_at_once() -> None:
    calls, call = _failing(ResponseError("WRONGTYPE Operation against a key"))
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        await read_while_unavailable(call, 5.0, "test")
    assert len(calls) == 1


async def test_past_its_budget_the_last_error_is_raised() -> None:
    calls, call = _failing(*[ResponseError("LOADING Redis is loading")] * 50)
    with pytest.raises(ResponseError, match="LOADING"):
        await read_while_unavailable(call, 0.2, "test")
    assert 1 < len(calls) < 50
