"""A small per-process cache of Redis lookups: at most `max_entries` values (least recently
used go first), each for `ttl_s` seconds. What the gateway caches this way (API keys, tenant
scheduling terms) reaches every gateway within `ttl_s` of a change in Redis."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class TtlCache(Generic[K, V]):
    def __init__(self, ttl_s: float, max_entries: int) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._entries: OrderedDict[K, tuple[V, float]] = OrderedDict()

    async def get(
        self,
        key: K,
        load: Callable[[], Awaitable[V]],
        fresh: Callable[[V], bool] | None = None,
    ) -> V:
        """The cached value of `key`, or `load()`'s (then cached) once it is missing, old, or
        not `fresh` (a value made under an older version of what it caches)."""
        now = time.monotonic()
        hit = self._entries.get(key)
        if hit is None or hit[1] <= now or (fresh is not None and not fresh(hit[0])):
            hit = (await load(), now + self.ttl_s)
            self._entries[key] = hit
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
        self._entries.move_to_end(key)
        return hit[0]
