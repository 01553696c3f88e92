"""The global redrive rate limit: one token bucket in Redis (rate_limit.lua) shared by every
redriver replica and every sweep, so a mass redrive cannot starve live traffic."""

from __future__ import annotations

import asyncio

from splatq.shared.engine.scripts import Script, ScriptCall, ScriptRunner


class RedriveBucket:
    def __init__(self, scripts: ScriptRunner, key: str, rate_per_s: float, burst: int) -> None:
        self._scripts = scripts
        self._key = key
        self.rate_per_s = rate_per_s
        self.burst = burst

    async def take(self, wanted: int) -> int:
        """Wait until tokens are available and take up to `wanted` of them (at least one,
        at most the burst); returns how many were taken."""
        cost = max(1, min(wanted, self.burst))
        while True:
            reply = await self._scripts.run(
                ScriptCall(Script.RATE_LIMIT, [self._key], [self.rate_per_s, self.burst, cost])
            )
            if isinstance(reply, Exception):
                raise reply
            allowed, retry_ms, left = int(reply[0]), int(reply[1]), int(reply[2])
            if allowed:
                return cost
            if left >= 1:  # fewer than asked: take what is there now
                cost = left
                continue
            await asyncio.sleep(max(retry_ms, 1) / 1000)
