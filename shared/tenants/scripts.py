"""The tenant and quota Lua scripts (`lua/`): a `LuaScript` family run by the engine's runner
(by SHA, reloaded after a NOSCRIPT, standalone or cluster), with its own helpers
(`lua/_helpers.lua`) and the engine's (`now_ms`, `key_tag`). No replay memo is needed: every
script is a compare-and-set on its own record (a saga step done once, a key id), so a resend
after a lost reply finds its own work done and answers so.
"""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis

from splatq.shared.engine.queue_types import raise_on_error
from splatq.shared.engine.scripts import LuaScript, ScriptCall, ScriptRunner


class TenantScript(LuaScript):
    QUOTA_RESERVE = "quota_reserve"
    QUOTA_RELEASE = "quota_release"
    QUOTA_CHARGE = "quota_charge"
    KEY_PUT = "key_put"
    KEY_REVOKE = "key_revoke"

    @classmethod
    def package(cls) -> str:
        return "splatq.shared.tenants"

    @property
    def replay_safe(self) -> bool:
        return True


class TenantScripts:
    def __init__(self, redis: Redis) -> None:
        self._runner = ScriptRunner(redis)
        self._runner.register(TenantScript)

    async def run(self, script: TenantScript, keys: list[str], args: list[Any]) -> list[str]:
        reply = await self._runner.run(ScriptCall(script, keys, args))
        raise_on_error(reply)
        return [str(v) for v in reply]
