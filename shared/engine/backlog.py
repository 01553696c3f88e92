"""What waits and what runs, per partition and stream: read-only, for `splatq info` and the
burst worker (which exits once everything it owns is idle).

A job waits in one of three places: a tenant's fair queue (`fair_waiting`, fed into the
stream by weighted round-robin as workers take), the stream itself (ready: not yet handed
to a worker, the consumer group's lag), or the delayed set (a retry before its due time).
One pipeline per partition reads the delayed set and, per stream, the fair-queue count and
oldest, the stream length and the consumer group; a second round reads the oldest ready
entry, for its age.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from splatq.shared.engine.keys import STREAMS, KeySchema, StreamName
from splatq.shared.engine.stages import ALL_STAGES


@dataclass(frozen=True, slots=True)
class StreamBacklog:
    partition: int
    stream: StreamName
    length: int
    consumers: int
    queued: int  # in the tenants' fair queues, not yet in the stream
    # In the stream, not handed to a worker yet (XINFO GROUPS `lag`); None when Redis cannot
    # tell (after deletions in the stream); `oldest_waiting_age_s` still says if any wait.
    ready: int | None
    pending: int  # handed to a worker and not acknowledged: running, or parked for redelivery
    oldest_waiting_age_s: float | None  # queued or ready, whichever waited longest; None: none

    @property
    def idle(self) -> bool:
        return (
            self.queued == 0
            and self.pending == 0
            and self.oldest_waiting_age_s is None
            and not self.ready
        )


@dataclass(frozen=True, slots=True)
class PartitionBacklog:
    partition: int
    delayed: int  # jobs waiting for a retry's due time
    streams: tuple[StreamBacklog, ...]

    @property
    def idle(self) -> bool:
        return self.delayed == 0 and all(s.idle for s in self.streams)


PER_STREAM = 4  # replies per stream in the first round


async def read_backlog(
    redis: Redis,
    keys: KeySchema,
    group: str,
    partition: int,
    streams: Sequence[StreamName] = STREAMS,
) -> PartitionBacklog:
    pipe = redis.pipeline(transaction=False)
    pipe.zcard(keys.delayed(partition))
    for stream in streams:
        pipe.zcard(keys.fair_waiting(partition, stream))
        pipe.zrange(keys.fair_waiting(partition, stream), 0, 0, withscores=True)
        pipe.xlen(keys.stream(partition, stream))
        pipe.xinfo_groups(keys.stream(partition, stream))
    replies = await pipe.execute(raise_on_error=False)
    _raise_unexpected(replies[0])
    delayed = int(replies[0])
    rows: list[tuple[int, float | None, int, dict[str, Any] | None]] = []
    for i in range(len(streams)):
        start = 1 + PER_STREAM * i
        queued, oldest_queued, length, infos = replies[start : start + PER_STREAM]
        for reply in (queued, oldest_queued, length):
            _raise_unexpected(reply)
        group_info = None
        if not isinstance(infos, ResponseError):  # else no such stream yet: nothing in it
            group_info = next((g for g in infos if _text(g.get("name")) == group), None)
        queued_since = float(oldest_queued[0][1]) if oldest_queued else None
        rows.append((int(queued), queued_since, int(length), group_info))
    pipe = redis.pipeline(transaction=False)
    for stream, (_, _, _, g) in zip(streams, rows, strict=True):
        after = _text(g.get("last-delivered-id")) if g else "0-0"
        pipe.xrange(keys.stream(partition, stream), min=f"({after}", count=1)
    firsts = await pipe.execute()
    now_ms = int(time.time() * 1000)
    out = []
    for stream, (queued, queued_since, length, g), first in zip(streams, rows, firsts, strict=True):
        ready = (int(g["lag"]) if g.get("lag") is not None else None) if g else length
        ages = [(now_ms - ms) / 1000 for ms in (queued_since, _entry_ms(first)) if ms is not None]
        out.append(
            StreamBacklog(
                partition=partition,
                stream=stream,
                length=length,
                consumers=int(g.get("consumers", 0)) if g else 0,
                queued=queued,
                ready=ready,
                pending=int(g.get("pending", 0)) if g else 0,
                oldest_waiting_age_s=max(0.0, *ages) if ages else None,
            )
        )
    return PartitionBacklog(partition, delayed, tuple(out))


async def read_stage_backlogs(
    redis: Redis, keys: KeySchema, group: str, partitions: int
) -> list[tuple[str, PartitionBacklog]]:
    """Every partition's entry streams ('' : what ingest and whole-job workers read), then
    each later stage's streams that exist, as (stage, backlog). A later stage's streams exist
    once a worker of it started or a job reached it; only the entry streams are fed from the
    fair queues (a later stage's `queued` is 0)."""
    out = []
    for p in range(partitions):
        out.append(("", await read_backlog(redis, keys, group, p)))
        for stage in ALL_STAGES[1:]:
            b = await read_backlog(redis, keys.for_stage(stage.value), group, p)
            streams = tuple(
                dataclasses.replace(s, queued=0)
                for s in b.streams
                if s.length or s.consumers or s.ready is None or s.pending
            )
            if streams:
                out.append((stage.value, dataclasses.replace(b, streams=streams)))
    return out


def _entry_ms(first: list[Any]) -> int | None:
    return int(_text(first[0][0]).split("-", 1)[0]) if first else None


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _raise_unexpected(reply: object) -> None:
    if isinstance(reply, Exception):
        raise reply
