"""Throttling of failed admin authentication: per client address and in all, per gateway
process. Pure (a clock is passed in); the gateway keeps one in its app.

Each is a token bucket of `per_minute` failures refilled at that rate. While either the
client's bucket or the global one is empty, every admin request (the right key included) is
answered 429 before its key is even compared, so guessing runs at the throttle's pace, not
the server's. The global bucket also bounds an attacker spread over many addresses; its price
is that such a flood locks the admin API of that process out for everyone until it refills
(the admin listener, SPLATQ_ADMIN_PORT, kept off the public network avoids that, and
`splatq tenants|keys|quota` talk to Redis directly).

Clients are tracked in a bounded map (least recently failed go first): a flood of addresses
cannot grow it, and an evicted client is still bounded by the global bucket.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

MAX_CLIENTS = 10_000


@dataclass(slots=True)
class _Bucket:
    tokens: float
    stamp: float


class FailureThrottle:
    def __init__(
        self,
        per_client_per_min: int,
        global_per_min: int,
        max_clients: int = MAX_CLIENTS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client_cap = float(per_client_per_min)
        self._global_cap = float(global_per_min)
        self._clock = clock
        self._max_clients = max_clients
        self._clients: OrderedDict[str, _Bucket] = OrderedDict()
        self._global = _Bucket(self._global_cap, clock())

    def retry_after_s(self, client: str) -> int:
        """0 when `client` may try a key now, else whole seconds until it may."""
        now = self._clock()
        waits = [_wait(_refill(self._global, self._global_cap, now), self._global_cap)]
        bucket = self._clients.get(client)
        if bucket is not None:
            waits.append(_wait(_refill(bucket, self._client_cap, now), self._client_cap))
        return max(waits)

    def failed(self, client: str) -> None:
        """Charge one failed authentication to `client` and to the global bucket."""
        now = self._clock()
        bucket = self._clients.pop(client, None) or _Bucket(self._client_cap, now)
        for b, cap in ((bucket, self._client_cap), (self._global, self._global_cap)):
            _refill(b, cap, now)
            b.tokens = max(0.0, b.tokens - 1)
        self._clients[client] = bucket
        while len(self._clients) > self._max_clients:
            self._clients.popitem(last=False)


def _refill(bucket: _Bucket, cap: float, now: float) -> _Bucket:
    bucket.tokens = min(cap, bucket.tokens + max(0.0, now - bucket.stamp) * cap / 60)
    bucket.stamp = now
    return bucket


def _wait(bucket: _Bucket, cap: float) -> int:
    if bucket.tokens >= 1:
        return 0
    return max(1, math.ceil((1 - bucket.tokens) * 60 / cap))


ADMIN_THROTTLE = web.AppKey("admin_throttle", FailureThrottle)
