"""The tenants' webhook signing secrets as the dispatcher signs with them: cached briefly per
tenant (a rotation shows within the cache period), concurrent first uses sharing one lookup,
and a failed lookup forgotten so that the next attempt asks again."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

Secrets = tuple[str, ...]


class SecretCache:
    def __init__(self, lookup: Callable[[str], Awaitable[Secrets]], ttl_s: float) -> None:
        self._lookup = lookup
        self._ttl_s = ttl_s
        self._entries: dict[str, tuple[float, asyncio.Future[Secrets]]] = {}

    async def get(self, tenant: str) -> Secrets:
        cached = self._entries.get(tenant)
        if cached is None or cached[0] <= time.monotonic():
            lookup = asyncio.ensure_future(self._lookup(tenant))
            cached = (time.monotonic() + self._ttl_s, lookup)
            self._entries[tenant] = cached
        try:
            return await asyncio.shield(cached[1])
        except Exception:
            if self._entries.get(tenant) is cached:
                del self._entries[tenant]  # the next attempt asks again
            raise
