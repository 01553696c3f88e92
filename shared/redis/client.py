"""Opens the asyncio Redis client for `SPLATQ_REDIS_URL` (standalone or `redis+cluster://`).

Connection settings only; no keys, no commands.
"""

from __future__ import annotations

from typing import Any, cast

import hiredis
from redis.asyncio import BlockingConnectionPool, Connection, Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import (
    BusyLoadingError,
    ClusterDownError,
    ClusterError,
    MasterDownError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

CLUSTER_SCHEME = "redis+cluster://"

# Error replies that say 'not now', not 'never': out of memory (maxmemory with noeviction), a
# replica during failover, a server loading its data, a cluster in motion, a busy script.
# redis-py maps most to classes and strips the code; a script's error keeps it in the text.
# ClusterError is also redis-py's "TTL exhausted": a command redirected (ASK, MOVED) or told
# TRYAGAIN more times than it follows, as during a slot migration or a failover; it did not run.
# NoScriptError left after the runner's reload: a primary promoted (or a node added) since
# the cluster client's slot map was read starts with an empty script cache, and SCRIPT LOAD
# went to the primaries the old map knew; the next try, after the map is refreshed, loads it.
_TRANSIENT_CLASSES = (
    ClusterError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    BusyLoadingError,
    MasterDownError,
    ClusterDownError,
    TryAgainError,
)
_TRANSIENT_PREFIXES = ("OOM", "READONLY", "LOADING", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN",
                       "BUSY", "NOREPLICAS")  # fmt: skip


# A script that reads a key it was not given (take.lua reads its entries' job hashes) while
# that key's slot is being migrated and the key has already moved: Redis stops the script
# there. Its writes before that point stand (scripts are not rolled back); take.lua's only
# one is the stream read, whose entries the reaper hands out again.
_MIGRATING_KEY = "non local key in a cluster node"


# A Redis that is briefly unreachable or reconfiguring (a node down, a slot without a known
# primary during a failover): the call may or may not have run.
_UNAVAILABLE_CLASSES = (RedisConnectionError, RedisTimeoutError, SlotNotCoveredError)


def is_transient_reply(exc: BaseException) -> bool:
    """An error worth trying again later with the same call: an error reply saying 'not now'
    (the command did not run, or stopped at a key mid-migration), or a lost connection. The
    latter reaches callers as a per-call result when a cluster client sends a batch's calls
    concurrently; a resend with the same request id is answered by the replay memo."""
    if isinstance(exc, _TRANSIENT_CLASSES + _UNAVAILABLE_CLASSES):
        return True
    if not isinstance(exc, ResponseError):
        return False
    text = str(exc).lstrip()
    return text.startswith(_TRANSIENT_PREFIXES) or _MIGRATING_KEY in text


def is_refused_for_now(exc: BaseException) -> bool:
    """An error reply saying 'not now': the command certainly did not run."""
    return isinstance(exc, ResponseError) and is_transient_reply(exc)


def error_reply_kind(exc: BaseException) -> str:
    """A bounded metric label for an error reply."""
    for cls, label in ((OutOfMemoryError, "oom"), (ReadOnlyError, "readonly"),
                       (BusyLoadingError, "loading")):  # fmt: skip
        if isinstance(exc, cls):
            return label
    return "transient" if is_transient_reply(exc) else "other"


class HiredisPackedConnection(Connection):
    """Packs commands with hiredis's C packer, as redis-py's sync client already does.

    redis-py's asyncio connection packs every argument in Python; for the engine's many-arg
    EVALSHA calls that was the largest single cost of a no-op job (see docs/benchmarks.md).
    """

    def pack_command(self, *args: Any) -> list[bytes]:
        first = args[0]
        # Same rule as redis-py: a multi-word command name ('XGROUP CREATE') is split.
        if (isinstance(first, str) and " " in first) or (
            isinstance(first, bytes) and b" " in first
        ):
            args = tuple(first.split()) + args[1:]
        return [hiredis.pack_command(args)]


def cluster_startup_nodes(url: str) -> tuple[str, list[tuple[str, int]]]:
    """`redis+cluster://[auth@]h1:p1[,h2:p2…][/…]` -> (`redis://[auth@]h1:p1[/…]`, the other
    nodes). Several startup nodes let a client started while one node is down still find the
    cluster; any one live node is enough."""
    rest = url[len(CLUSTER_SCHEME) :]
    hosts_end = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    auth, _, hosts = rest[:hosts_end].rpartition("@")
    first, *others = hosts.split(",")
    nodes = []
    for node in others:
        host, _, port = node.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"a cluster node is host:port, not {node!r}")
        nodes.append((host, int(port)))
    prefix = f"redis://{auth}@" if auth else "redis://"
    return prefix + first + rest[hosts_end:], nodes


class ClusterInMotionError(TryAgainError, ClusterError):
    """redis-py's cluster client gave up following a slot (redirects or TRYAGAIN past its
    limit during a migration, a slot with no known primary during a failover): raised as the
    error reply it stands for, so every caller that survives TRYAGAIN on one Redis (the
    worker's loops, the committer, the gateway's 503) survives this too. Nothing ran."""


class MovingRedisCluster(RedisCluster):
    """The cluster client, with its give-up errors turned into ClusterInMotionError."""

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().execute_command(*args, **kwargs)
        except (SlotNotCoveredError, ClusterError) as exc:
            if isinstance(exc, ResponseError):  # CLUSTERDOWN, MASTERDOWN: replies already
                raise
            raise ClusterInMotionError(f"TRYAGAIN {exc}") from exc


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
        # confined to one {pN} slot, which is what makes this swap possible. It follows
        # MOVED/ASK itself and refreshes its slot map after MOVED, CLUSTERDOWN or a lost node.
        first, others = cluster_startup_nodes(url)
        cluster = MovingRedisCluster.from_url(
            first,
            client_name=client_name,
            startup_nodes=[ClusterNode(host, port) for host, port in others],
            **common,
        )
        return cast("Redis", cluster)
    # A blocking pool waits for a free connection instead of failing under bursts.
    pool = BlockingConnectionPool.from_url(
        url,
        client_name=client_name,
        max_connections=max_connections,
        timeout=30,
        connection_class=HiredisPackedConnection,
        **common,
    )
    return Redis.from_pool(pool)
