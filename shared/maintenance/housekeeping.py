"""The small scheduled tasks: consumer pruning, stream bounds, expired leases nobody
reclaims, and expiry of job records and claims that lost their TTL. Each walks partitions
(and streams) with a checkpoint, so a crashed run resumes where it stopped."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog
from redis.asyncio.cluster import ClusterNode, RedisCluster

from splatq.shared.engine.keys import STREAMS, StreamName
from splatq.shared.engine.queue import JobQueue
from splatq.shared.maintenance.schedule import Schedule
from splatq.shared.maintenance.scheduler import TaskRun

log = structlog.get_logger("splatq.tasks")
CONSUMER_IDLE_MS = 3600_000
TERMINAL = frozenset({"completed", "failed", "canceled"})
FILL_WARNING = 0.8


def _resume_at(checkpoint: str) -> int:
    return int(checkpoint) + 1 if checkpoint.isdigit() else 0


@dataclass
class PruneConsumers:
    """Consumers of dead workers (no pending entries, idle an hour) leave the groups."""

    queue: JobQueue
    schedule: Schedule
    name: str = "prune_consumers"

    async def run(self, run: TaskRun) -> str:
        removed = 0
        for p in range(_resume_at(run.checkpoint), self.queue.settings.partitions):
            for stream in STREAMS:
                removed += await self.queue.prune_consumers(p, stream, CONSUMER_IDLE_MS)
            await run.save(str(p))
        return f"{removed} consumers pruned"


FillReport = Callable[[str, int, float], None]


@dataclass
class StreamBounds:
    """Each stream's length against its MAXLEN cap: past FILL_WARNING a warning (trimming at
    the cap would drop entries: work, events or dead letters)."""

    queue: JobQueue
    schedule: Schedule
    report: FillReport | None = None
    name: str = "stream_bounds"

    async def run(self, run: TaskRun) -> str:
        s, keys = self.queue.settings, self.queue.keys
        over: list[str] = []
        for p in range(_resume_at(run.checkpoint), s.partitions):
            caps = {stream.value: (keys.stream(p, stream), s.stream_maxlen) for stream in STREAMS}
            caps["events"] = (keys.events(p), s.events_maxlen)
            caps["dlq:jobs"] = (keys.dead_letters(p), s.dlq_maxlen)
            caps["dlq:webhooks"] = (keys.webhook_dead_letters(p), s.dlq_maxlen)
            pipe = self.queue.redis.pipeline(transaction=False)
            for key, _ in caps.values():
                pipe.xlen(key)
            lengths = await pipe.execute()
            for (name, (_, cap)), length in zip(caps.items(), lengths, strict=True):
                ratio = int(length) / cap
                if self.report is not None:
                    self.report(name, p, ratio)
                if ratio >= FILL_WARNING:
                    over.append(f"{name}/{p} {ratio:.0%}")
                    log.warning("stream.near_bound", stream=name, partition=p, length=length,
                                maxlen=cap)  # fmt: skip
            await run.save(str(p))
        return "over 80 %: " + ", ".join(over) if over else "every stream within its bound"


LeaseReport = Callable[[int, int], None]


@dataclass
class ExpiredLeases:
    """Jobs `processing` whose lease key lapsed longer ago than the reaper needs (lease TTL +
    two reaper intervals) and whose entry nobody took: no live worker reaps that stream. An
    alarm metric, not an action: the reaper stays the one that takes jobs over."""

    queue: JobQueue
    schedule: Schedule
    report: LeaseReport | None = None
    name: str = "expired_leases"
    limit: int = 1000

    async def run(self, run: TaskRun) -> str:
        s = self.queue.settings
        idle_ms = s.lease_ttl_ms + 2 * s.reaper_interval_ms
        total = 0
        for p in range(_resume_at(run.checkpoint), s.partitions):
            found = 0
            for stream in STREAMS:
                found += await self._stuck(p, stream, idle_ms)
            if self.report is not None:
                self.report(p, found)
            total += found
            await run.save(str(p))
        return f"{total} jobs processing under an expired lease"

    async def _stuck(self, partition: int, stream: StreamName, idle_ms: int) -> int:
        q = self.queue
        pending = await q.redis.xpending_range(
            q.keys.stream(partition, stream), q.group, "-", "+", self.limit, idle=idle_ms
        )
        if not pending:
            return 0
        ids = [str(x["message_id"]) for x in pending]
        entries = await q.redis.xrange(q.keys.stream(partition, stream), ids[0], ids[-1])
        jobs = [dict(f).get("job", "") for eid, f in entries if str(eid) in set(ids)]
        jobs = [j for j in jobs if j]
        if not jobs:
            return 0
        pipe = q.redis.pipeline(transaction=False)
        for job_id in jobs:
            pipe.hget(q.keys.job(job_id), "status")
            pipe.exists(q.keys.lease(job_id))
        replies = await pipe.execute()
        return sum(
            1 for status, alive in zip(replies[::2], replies[1::2], strict=True)
            if status == "processing" and not alive
        )  # fmt: skip


@dataclass
class ExpireRecords:
    """Job records in a terminal state, and idempotency claims, that have no TTL (written by
    hand, or by a version that forgot one) get their retention, so nothing stays forever.

    SCAN walks one node's keyspace: on Redis Cluster each primary is scanned in turn (in name
    order), and the checkpoint is `<node>|<cursor>` (`|<cursor>` on one Redis). A resumed run
    whose node is no longer a primary (a failover, a reshard) starts over: giving a TTL is
    idempotent (PEXPIRE NX), and a key that moved while scanned is found on the next run."""

    queue: JobQueue
    schedule: Schedule
    name: str = "expire_records"
    batch: int = 500

    async def run(self, run: TaskRun) -> str:
        started = time.monotonic()
        node_name, _, raw_cursor = run.checkpoint.rpartition("|")
        cursor = int(raw_cursor) if raw_cursor.isdigit() else 0
        nodes = self._nodes()
        names = [name for name, _ in nodes]
        if run.checkpoint and node_name in names:
            at = names.index(node_name)
            if cursor == 0:  # that node was done
                at += 1
        else:
            at, cursor = 0, 0
        expired = 0
        for name, node in nodes[at:]:
            while True:
                cursor, keys = await self._scan(node, cursor)
                expired += await self._expire(keys)
                await run.save(f"{name}|{cursor}")
                if cursor == 0:
                    break
        where = f" on {len(nodes)} primaries" if len(nodes) > 1 else ""
        return f"{expired} records given a TTL{where} ({time.monotonic() - started:.1f} s)"

    def _nodes(self) -> list[tuple[str, ClusterNode | None]]:
        redis: Any = self.queue.redis  # typed as Redis; a RedisCluster on a cluster
        if isinstance(redis, RedisCluster):
            return sorted(((n.name, n) for n in redis.get_primaries()), key=lambda x: x[0])
        return [("", None)]

    async def _scan(self, node: ClusterNode | None, cursor: int) -> tuple[int, list[str]]:
        redis: Any = self.queue.redis
        pattern = f"{self.queue.keys.prefix}:{{p*}}:*"
        if node is None:
            cursor, keys = await redis.scan(cursor, match=pattern, count=self.batch)
            return int(cursor), list(map(str, keys))
        cursors, keys = await redis.scan(cursor, match=pattern, count=self.batch, target_nodes=node)
        return int(cursors[node.name]), list(map(str, keys))

    async def _expire(self, keys: list[str]) -> int:
        q = self.queue
        jobs = [k for k in keys if ":job:" in k and k.count(":") == 3]
        claims = [k for k in keys if ":idem:" in k]
        pipe = q.redis.pipeline(transaction=False)
        for k in jobs + claims:
            pipe.pttl(k)
        for k in jobs:
            pipe.hget(k, "status")
        replies = await pipe.execute()
        ttls, statuses = replies[: len(jobs) + len(claims)], replies[len(jobs) + len(claims) :]
        pipe = q.redis.pipeline(transaction=False)
        count = 0
        for k, ttl, status in zip(jobs, ttls[: len(jobs)], statuses, strict=True):
            if ttl == -1 and status in TERMINAL:
                pipe.pexpire(k, q.settings.job_retention_ms, nx=True)
                count += 1
        for k, ttl in zip(claims, ttls[len(jobs) :], strict=True):
            if ttl == -1:
                pipe.pexpire(k, q.settings.idempotency_ttl_s * 1000, nx=True)
                count += 1
        if count:
            await pipe.execute()
        return count
