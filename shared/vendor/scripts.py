"""The vendor lane's Lua scripts (`lua/`), each with the shared helpers it names.

redis-py's `Script` runs them by SHA and loads them again after a NOSCRIPT (a restarted or
promoted server), standalone or cluster. Each is safe to resend on its own (a grant records
its permit id, renewals and releases are compare-and-set, a report carries a marker), so no
replay memo is needed.
"""

from __future__ import annotations

from enum import StrEnum
from importlib import resources
from typing import Any

from redis.asyncio import Redis


class LaneScript(StrEnum):
    ACQUIRE = "acquire"
    HOLD = "hold"
    RELEASE = "release"
    REPORT = "report"


def _source(name: str) -> str:
    return (resources.files("splatq.shared.vendor") / "lua" / f"{name}.lua").read_text()


def with_helpers(body: str) -> str:
    """The body, preceded by the helper definitions it uses (Redis runs the whole text on
    every call: an unused helper costs each call its definition)."""
    chunks = _source("_common").split("\nlocal function ")
    used = [c for c in chunks[1:] if c.split("(", 1)[0] in body]
    return "".join("local function " + c.rstrip() + "\n\n" for c in used) + body


class LaneScripts:
    def __init__(self, redis: Redis) -> None:
        self._scripts = {
            s: redis.register_script(with_helpers(_source(s.value))) for s in LaneScript
        }

    async def run(self, script: LaneScript, keys: list[str], args: list[Any]) -> Any:
        return await self._scripts[script](keys=keys, args=args)
