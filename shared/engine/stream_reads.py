"""The backlog read model: what waits and what runs per partition and stream (metrics, the
ops console, `splatq info`): lengths, consumer-group state, fair-queue waits, per-tenant
backlogs and per-status counts."""

from __future__ import annotations

import time

from splatq.shared.engine.backend import Role
from splatq.shared.engine.keys import StreamName
from splatq.shared.engine.queue_types import StreamStats, WaitingStats, entry_age_s


class StreamReads(Role):
    async def backlog(self, partition: int, stream: StreamName) -> int:
        """Entries in a stream partition (waiting + running: acked entries are deleted)."""
        return int(await self.redis.xlen(self.keys.stream(partition, stream)))

    async def stream_stats(self, partition: int, stream: StreamName) -> StreamStats:
        """Length, pending, lag, consumers and ages of this queue's stream of `stream`; a
        stream or group nobody created yet (a stage no worker runs) reads as one whose
        entries all wait."""
        key = self.keys.stream(partition, stream)
        pipe = self.redis.pipeline(transaction=False)
        pipe.xlen(key)
        pipe.xpending(key, self.group)
        pipe.xinfo_groups(key)
        length, pending, groups = await pipe.execute(raise_on_error=False)
        if isinstance(length, Exception):
            raise length
        if isinstance(pending, Exception):  # NOGROUP: nothing delivered
            pending = None
        if isinstance(groups, Exception):  # no such stream
            groups = []
        lag: int | None = None
        consumers = 0
        last_delivered = "0-0"
        for g in groups:
            if g.get("name") == self.group:
                raw_lag = g.get("lag")
                lag = int(raw_lag) if raw_lag is not None else None
                consumers = int(g.get("consumers", 0))
                last_delivered = str(g.get("last-delivered-id") or "0-0")
        # Waiting = after the group's last-delivered id (delivered entries are the PEL's).
        first_waiting = await self.redis.xrange(key, f"({last_delivered}", "+", count=1)
        oldest = pending.get("min") if pending else None
        now_ms = int(time.time() * 1000)
        return StreamStats(
            partition=partition,
            stream=stream,
            length=int(length),
            pending=int(pending.get("pending", 0)) if pending else 0,
            lag=lag,
            oldest_pending_age_s=entry_age_s(str(oldest), now_ms) if oldest else 0.0,
            consumers=consumers,
            oldest_waiting_age_s=(
                entry_age_s(str(first_waiting[0][0]), now_ms) if first_waiting else 0.0
            ),
        )

    async def waiting(self, partition: int, stream: StreamName) -> WaitingStats:
        """How much waits in line (fair queues) and in the stream, and the oldest wait."""
        waiting_key = self.keys.fair_waiting(partition, stream)
        pipe = self.redis.pipeline(transaction=False)
        pipe.zcard(waiting_key)
        pipe.zrange(waiting_key, 0, 0, withscores=True)
        pipe.xlen(self.keys.stream(partition, stream))
        count, oldest, in_stream = await pipe.execute()
        age = 0.0
        if oldest:
            age = max(0.0, time.time() - float(oldest[0][1]) / 1000.0)
        return WaitingStats(int(count), int(in_stream), age)

    async def tenant_backlogs(
        self, partition: int, stream: StreamName
    ) -> dict[str, tuple[int, int]]:
        """Per tenant with work in the fair queues of one stream: (jobs waiting, jobs counted
        against its running cap). Operators' view and per-tenant metrics; O(active tenants).
        A job canceled while it waits leaves its queue at once (cancel.lua)."""
        state = await self.redis.hgetall(f"{self.keys.fair_base(partition, stream)}:state")  # type: ignore[misc]
        tenants = sorted(
            {k[2:] for k in state if k.startswith(("a:", "r:"))}  # in line, or running capped
        )
        if not tenants:
            return {}
        pipe = self.redis.pipeline(transaction=False)
        for tenant in tenants:
            pipe.llen(self.keys.fair_queue(partition, stream, tenant))
        lengths = await pipe.execute()
        return {
            t: (int(n), int(state.get(f"r:{t}", 0))) for t, n in zip(tenants, lengths, strict=True)
        }

    async def partition_counts(self, partition: int) -> dict[str, int]:
        pipe = self.redis.pipeline(transaction=False)
        pipe.zcard(self.keys.delayed(partition))
        pipe.xlen(self.keys.dead_letters(partition))
        pipe.xlen(self.keys.events(partition))
        pipe.get(self.keys.alarm_counter(partition))
        delayed, dlq, evts, lost = await pipe.execute()
        return {
            "delayed": int(delayed),
            "dead_letters": int(dlq),
            "events": int(evts),
            "lost_entries": int(lost or 0),
        }
