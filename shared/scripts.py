"""Loads the Lua scripts in `shared/lua/`, prefixed with the generated transition table.

Runs them by SHA with one reload-and-retry when Redis answers NOSCRIPT (after a restart the
script cache is empty); it must not hold any business logic itself.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from importlib import resources
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import NoScriptError

from shared.states import lua_transition_table

Arg = str | int | float | bytes


class Script(StrEnum):
    ENQUEUE = "enqueue"
    CLAIM = "claim"
    START = "start"
    TAKE = "take"
    RENEW = "renew"
    PROGRESS = "progress"
    FINISH = "finish"
    RECLAIM = "reclaim"
    PROMOTE = "promote"
    CANCEL = "cancel"
    DEAD_LETTER_ENTRY = "dead_letter_entry"
    PRUNE_CONSUMERS = "prune_consumers"
    RATE_LIMIT = "rate_limit"
    REDRIVE = "redrive"
    WH_FANOUT = "wh_fanout"
    WH_CLAIM = "wh_claim"
    WH_RESULT = "wh_result"
    WH_REDRIVE = "wh_redrive"
    WH_SECRET_ROTATE = "wh_secret_rotate"
    WH_EP_CREATE = "wh_ep_create"
    WH_EP_UPDATE = "wh_ep_update"
    WH_EP_ROTATE = "wh_ep_rotate"
    WH_EP_DELETE = "wh_ep_delete"
    WH_EP_GATE = "wh_ep_gate"
    WH_EP_HEALTH = "wh_ep_health"


def _source(name: str) -> str:
    return (resources.files("shared") / "lua" / f"{name}.lua").read_text()


@dataclass(frozen=True, slots=True)
class ScriptCall:
    """One script invocation: which script, its KEYS and its ARGV."""

    script: Script
    keys: Sequence[str]
    args: Sequence[Arg]


class ScriptRunner:
    """Runs scripts singly or many per round trip (a pipeline of EVALSHA)."""

    def __init__(self, redis: Redis) -> None:
        preamble = lua_transition_table() + _source("_preamble")
        self._redis = redis
        self._cluster = isinstance(redis, RedisCluster)
        self._bodies = {s: preamble + "\n" + _source(s.value) for s in Script}
        self._shas = {s: hashlib.sha1(b.encode()).hexdigest() for s, b in self._bodies.items()}

    async def load(self) -> None:
        """SCRIPT LOAD everything (idempotent); also called after a NOSCRIPT. One call per
        script, not a pipeline: a cluster client sends SCRIPT LOAD to every primary, which it
        refuses to do inside a pipeline."""
        for body in self._bodies.values():
            await self._redis.script_load(body)

    async def run(self, call: ScriptCall) -> Any:
        return (await self.run_many([call]))[0]

    async def run_many(self, calls: Sequence[ScriptCall]) -> list[Any]:
        """Results in call order; a per-call Redis error is returned as the exception object."""
        if not calls:
            return []
        results = await self._execute(calls)
        missing = [i for i, r in enumerate(results) if isinstance(r, NoScriptError)]
        if missing:
            # Only the NOSCRIPT calls did not run; re-running exactly those is safe.
            await self.load()
            retried = await self._execute([calls[i] for i in missing])
            for i, r in zip(missing, retried, strict=True):
                results[i] = r
        return results

    async def _evalsha(self, call: ScriptCall) -> Any:
        return await self._redis.evalsha(  # type: ignore[misc]
            self._shas[call.script], len(call.keys), *call.keys, *call.args
        )

    async def _execute(self, calls: Sequence[ScriptCall]) -> list[Any]:
        if self._cluster:
            # redis-py refuses EVALSHA in cluster pipelines; concurrent calls, each routed to
            # the node of its slot, keep the one-round-trip-per-batch property per node.
            return list(await asyncio.gather(
                *(self._evalsha(c) for c in calls), return_exceptions=True
            ))  # fmt: skip
        pipe = self._redis.pipeline(transaction=False)
        for c in calls:
            pipe.evalsha(self._shas[c.script], len(c.keys), *c.keys, *c.args)
        return list(await pipe.execute(raise_on_error=False))
