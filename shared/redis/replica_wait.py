"""`WAIT` after the writes that matter (SPLATQ_REDIS_WAIT_REPLICAS): the write is on at least
that many replicas before the caller answers, so a failover does not lose it.

WAIT counts the writes of the connection it is sent on, and a client's pool (or a cluster
client's per-node pools) may have sent the write on another one. So a tiny probe write to the
same hash slot goes first, on the same connection as the WAIT: replication is ordered, and a
replica that has the probe has every earlier write of that node.
"""

from __future__ import annotations

import time
from typing import Any

import structlog
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import SSLConnection
from redis.exceptions import RedisError, ResponseError

from splatq.shared.redis.replay import replay_key

log = structlog.get_logger("splatq.redis")
PROBE_TTL_MS = 10_000
NOT_CONFIRMED = -1
# After a short WAIT, the same slot is only checked (WAIT with this timeout) for a while.
SHORT_CHECK_MS = 5
SHORT_MEMO_S = 1.0


def probe_key(key: str) -> str:
    """A key in `key`'s hash slot (its `{...}` tag, as the scripts' replay memos use)."""
    return replay_key(key, "replica-wait")


class ReplicaWait:
    """`after_write(key)`: until `replicas` replicas have every write made so far to the node
    that holds `key` (at most `timeout_ms`). Returns how many did, NOT_CONFIRMED (-1) when
    the node could not be asked; never raises for a Redis error (the write itself is done)."""

    def __init__(self, redis: Redis | RedisCluster, replicas: int, timeout_ms: int) -> None:
        self.redis: Redis | RedisCluster = redis
        self.replicas = replicas
        self.timeout_ms = timeout_ms
        self._nodes: dict[tuple[str, int], Redis] = {}
        self._short_until: dict[str, float] = {}  # slot tag -> until when (monotonic s)

    @property
    def enabled(self) -> bool:
        return self.replicas > 0

    async def after_write(self, key: str, **log_fields: Any) -> int:
        if not self.enabled:
            return self.replicas
        probe = probe_key(key)
        slot = probe[probe.find("{") : probe.find("}") + 1]
        # A node that came up short moments ago (a promoted primary whose replica is gone)
        # is only checked, not waited for: otherwise every write to it would stall a full
        # timeout until a replica is back. Its callers still hear "short".
        short = self._short_until.get(slot, 0.0) > time.monotonic()
        timeout_ms = SHORT_CHECK_MS if short else self.timeout_ms
        try:
            acked = await self._wait_on(await self._client_for(probe), probe, timeout_ms)
        except RedisError as exc:
            log.warning("redis.wait_failed", key=key, error=str(exc), **log_fields)
            return NOT_CONFIRMED
        if acked < self.replicas:
            self._short_until[slot] = time.monotonic() + SHORT_MEMO_S
            log.warning("redis.wait_short", key=key, acked=acked, wanted=self.replicas,
                        timeout_ms=timeout_ms, **log_fields)  # fmt: skip
        else:
            self._short_until.pop(slot, None)
        return acked

    async def _wait_on(self, client: Redis, probe: str, timeout_ms: int, redirects: int = 2) -> int:
        async with client.pipeline(transaction=False) as pipe:
            pipe.set(probe, "1", px=PROBE_TTL_MS)
            pipe.wait(self.replicas, timeout_ms)
            written, acked = await pipe.execute(raise_on_error=False)
        if isinstance(written, ResponseError) and str(written).startswith(("MOVED", "ASK")):
            # The slot moved (resharding, failover) since the cluster client's map was read.
            if redirects == 0:
                raise written
            host, _, port = str(written).split()[-1].rpartition(":")
            node = self._node_client(host, int(port))
            return await self._wait_on(node, probe, timeout_ms, redirects - 1)
        for reply in (written, acked):
            if isinstance(reply, Exception):
                raise reply
        return int(acked)

    async def _client_for(self, probe: str) -> Redis:
        if not isinstance(self.redis, RedisCluster):
            return self.redis
        node = self.redis.get_node_from_key(probe)
        if node is None:
            raise RedisError(f"no cluster node serves {probe}")
        return self._node_client(node.host, int(node.port))

    def _node_client(self, host: str, port: int) -> Redis:
        """A plain client of one cluster node (WAIT and its probe need one connection)."""
        client = self._nodes.get((host, port))
        if client is None:
            kw: dict[str, Any] = (
                self.redis.connection_kwargs if isinstance(self.redis, RedisCluster) else {}
            )
            client = Redis(
                host=host, port=port, decode_responses=True, max_connections=64,
                username=kw.get("username"), password=kw.get("password"),
                ssl=kw.get("connection_class") is SSLConnection,
            )  # fmt: skip
            self._nodes[(host, port)] = client
        return client

    async def aclose(self) -> None:
        for client in self._nodes.values():
            await client.aclose()
        self._nodes.clear()
