"""What waits and what runs, per partition and stream: read-only, for `splatq info` and the
burst worker (which exits once everything it owns is idle).

One pipeline per partition: the delayed set (retries not yet due), then for each stream its
length and the consumer group (consumers, pending, lag, last delivered id); a second round
reads the oldest entry not yet delivered, for its age.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from splatq.shared.engine.keys import STREAMS, KeySchema, StreamName


@dataclass(frozen=True, slots=True)
class StreamBacklog:
    partition: int
    stream: StreamName
    length: int
    consumers: int
    # Entries the group has not been handed yet (XINFO GROUPS `lag`); None when Redis cannot
    # tell (after deletions in the stream), then `oldest_waiting_age_s` still says if any wait.
    lag: int | None
    pending: int  # handed to a worker and not acknowledged: running, or parked for redelivery
    oldest_waiting_age_s: float | None  # None: nothing waits

    @property
    def idle(self) -> bool:
        return self.pending == 0 and self.oldest_waiting_age_s is None and not self.lag


@dataclass(frozen=True, slots=True)
class PartitionBacklog:
    partition: int
    delayed: int  # jobs waiting for a retry's due time
    streams: tuple[StreamBacklog, ...]

    @property
    def idle(self) -> bool:
        return self.delayed == 0 and all(s.idle for s in self.streams)


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
        pipe.xlen(keys.stream(partition, stream))
        pipe.xinfo_groups(keys.stream(partition, stream))
    replies = await pipe.execute(raise_on_error=False)
    _raise_unexpected(replies[0])
    delayed = int(replies[0])
    groups: list[dict[str, Any] | None] = []
    lengths: list[int] = []
    for i in range(len(streams)):
        length, infos = replies[1 + 2 * i], replies[2 + 2 * i]
        _raise_unexpected(length)
        lengths.append(int(length))
        if isinstance(infos, ResponseError):  # no such stream yet: nothing in it
            groups.append(None)
            continue
        groups.append(next((g for g in infos if _text(g.get("name")) == group), None))
    pipe = redis.pipeline(transaction=False)
    for stream, g in zip(streams, groups, strict=True):
        after = _text(g.get("last-delivered-id")) if g else "0-0"
        pipe.xrange(keys.stream(partition, stream), min=f"({after}", count=1)
    firsts = await pipe.execute()
    now_ms = int(time.time() * 1000)
    out = []
    for stream, g, length, first in zip(streams, groups, lengths, firsts, strict=True):
        lag = (int(g["lag"]) if g.get("lag") is not None else None) if g else length
        out.append(
            StreamBacklog(
                partition=partition,
                stream=stream,
                length=length,
                consumers=int(g.get("consumers", 0)) if g else 0,
                lag=lag,
                pending=int(g.get("pending", 0)) if g else 0,
                oldest_waiting_age_s=_age_s(_text(first[0][0]), now_ms) if first else None,
            )
        )
    return PartitionBacklog(partition, delayed, tuple(out))


def _age_s(entry_id: str, now_ms: int) -> float:
    return max(0.0, (now_ms - int(entry_id.split("-", 1)[0])) / 1000)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _raise_unexpected(reply: object) -> None:
    if isinstance(reply, Exception):
        raise reply
