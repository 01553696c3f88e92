"""Retry a Redis call that was refused for now (TRYAGAIN during a slot migration, redirects
past redis-py's limit, CLUSTERDOWN or READONLY during a failover, LOADING, OOM), within a time
budget: for callers that would rather wait a moment than fail. Only error replies are retried
(they mean the command did not run, so a resend cannot do anything twice), except for reads,
which may also be resent after a lost connection (`read_while_unavailable`)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import structlog

from splatq.shared.backoff import Backoff
from splatq.shared.redis.client import is_refused_for_now, is_transient_reply

T = TypeVar("T")
log = structlog.get_logger("splatq.redis")
FIRST_DELAY_S = 0.05
MAX_DELAY_S = 0.5


async def while_refused(call: Callable[[], Awaitable[T]], budget_s: float, what: str) -> T:
    """`call()`, again after a backoff while it raises a transient error reply, until
    `budget_s` has passed; then the last error is raised."""
    return await _retrying(call, budget_s, what, is_refused_for_now)


async def read_while_unavailable(call: Callable[[], Awaitable[T]], budget_s: float, what: str) -> T:
    """For reads only (a repeat changes nothing): `call()`, again after a backoff while it
    raises a transient error reply *or loses its connection* (the reply lost, or Redis away
    for a moment), until `budget_s` has passed; then the last error is raised."""
    return await _retrying(call, budget_s, what, is_transient_reply)


async def _retrying(
    call: Callable[[], Awaitable[T]],
    budget_s: float,
    what: str,
    retry_if: Callable[[BaseException], bool],
) -> T:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + budget_s
    backoff = Backoff(FIRST_DELAY_S, MAX_DELAY_S)
    while True:
        try:
            return await call()
        except Exception as exc:
            if not retry_if(exc) or loop.time() + backoff.delay_s > deadline:
                raise
            log.info("redis.retrying", what=what, error=repr(exc), retry_in_s=backoff.delay_s)
        await backoff.sleep()
