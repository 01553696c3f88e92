"""The tenant and quota Lua scripts (`lua/`), each with the shared helpers it names.

redis-py's `Script` runs them by SHA and loads them again after a NOSCRIPT (a restarted or
promoted server), standalone or cluster. No replay memo is needed: every script is a
compare-and-set on its own record (a saga step done once, a key id), so a resend after a lost
reply finds its own work done and answers so.
"""

from __future__ import annotations

from enum import StrEnum
from importlib import resources
from typing import Any

from redis.asyncio import Redis


class TenantScript(StrEnum):
    QUOTA_RESERVE = "quota_reserve"
    QUOTA_RELEASE = "quota_release"
    QUOTA_CHARGE = "quota_charge"
    KEY_PUT = "key_put"
    KEY_REVOKE = "key_revoke"


_HELPERS = ("now_ms", "key_tag", "parse_reservation", "unreserve", "keep_for")


def _source(name: str) -> str:
    return (resources.files("splatq.shared.tenants") / "lua" / f"{name}.lua").read_text()


def _with_helpers(body: str) -> str:
    """The body, preceded by the helper definitions it uses (Redis runs the whole text on
    every call: an unused helper costs each call its definition)."""
    chunks = _source("_common").split("\nlocal function ")
    used = [c for c in chunks[1:] if c.split("(", 1)[0] in body]
    return "".join("local function " + c.rstrip() + "\n\n" for c in used) + body


class TenantScripts:
    def __init__(self, redis: Redis) -> None:
        self._scripts = {
            s: redis.register_script(_with_helpers(_source(s.value))) for s in TenantScript
        }

    async def run(self, script: TenantScript, keys: list[str], args: list[Any]) -> list[str]:
        reply = await self._scripts[script](keys=keys, args=args)
        return [str(v) for v in reply]
