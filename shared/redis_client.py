"""Opens the asyncio Redis client for `SPLATQ_REDIS_URL` (standalone or `redis+cluster://`).

Connection settings only; no keys, no commands.
"""

from __future__ import annotations

from typing import Any, cast

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

CLUSTER_SCHEME = "redis+cluster://"


def connect(url: str, *, client_name: str = "splatq", max_connections: int = 64) -> Redis:
    """A client with short reconnect retries; callers handle longer outages themselves."""
    retry = Retry(ExponentialBackoff(cap=1.0, base=0.05), retries=3)
    common: dict[str, Any] = {
        "decode_responses": True,
        "health_check_interval": 15,
        "socket_keepalive": True,
        "retry": retry,
        "retry_on_error": [RedisConnectionError, RedisTimeoutError],
    }
    if url.startswith(CLUSTER_SCHEME):
        # The cluster client speaks the same command API; every multi-key call we make is
        # confined to one {pN} slot, which is what makes this swap possible.
        cluster = RedisCluster.from_url(
            "redis://" + url[len(CLUSTER_SCHEME) :], client_name=client_name, **common
        )
        return cast("Redis", cluster)
    # A blocking pool waits for a free connection instead of failing under bursts.
    pool = BlockingConnectionPool.from_url(
        url, client_name=client_name, max_connections=max_connections, timeout=30, **common
    )
    return Redis.from_pool(pool)
