"""A worker's fetch loop: what it starts, and when it waits.

Each round reaps abandoned entries where due, then takes new entries for the free slots
(take.lua: read and start in one round trip) from each owned partition; when there is
nothing for the classes with room, it waits -- for a slot (a class saturated, or the next
stage full) or in a blocking read (room on every class). Started jobs go to the worker's
`launch`; entries that did not start go to the dead-letter stream or to `Unstarted`.
The slots are the worker's pool: the fetcher acquires one per start and gives it back
through `release` when a start does not happen.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from redis.exceptions import ResponseError
from structlog.stdlib import BoundLogger

from splatq.shared.engine.entries import UNKNOWN_JOB, entry_problem
from splatq.shared.engine.fleet import REDIS_ERRORS, FleetMember
from splatq.shared.engine.jobs import JobRecord
from splatq.shared.engine.keys import STREAMS, StreamName
from splatq.shared.engine.metrics import EngineMetrics
from splatq.shared.engine.queue import JobQueue, StreamEntry
from splatq.shared.engine.reaper import Reaper
from splatq.shared.engine.replies import Reply
from splatq.shared.engine.slots import SlotPool
from splatq.shared.engine.unstarted import Unstarted
from splatq.shared.redis.client import error_reply_kind, is_transient_reply

# How long a worker keeps resending one take/start call whose reply was lost (the replay
# memo answers the resend with the first execution's reply, so nothing runs twice).
RESEND_WINDOW_S = 5.0
# Back-off after an error reply the fetch loop cannot act on (a script error, OOM).
ERROR_REPLY_BACKOFF_S = 1.0
# How long the fetch loop waits before looking again when it cannot block (a saturated
# stream, or several partitions): bounds the start latency of newly arrived work.
IDLE_POLL_S = 0.05

Launch = Callable[[StreamEntry, str, JobRecord], None]


class Fetcher:
    """Takes and starts work for one worker's slot pool until `stopping` is set."""

    def __init__(
        self,
        queue: JobQueue,
        pool: SlotPool,
        partitions: tuple[int, ...],
        member: FleetMember,
        reaper: Reaper,
        unstarted: Unstarted,
        launch: Launch,
        release: Callable[[StreamName], None],
        stopping: asyncio.Event,
        log: BoundLogger,
        block_ms: int,
        metrics: EngineMetrics | None = None,
    ) -> None:
        self.queue = queue
        self.pool = pool
        self.partitions = partitions
        self.member = member
        self.reaper = reaper
        self._unstarted = unstarted
        self._launch = launch
        self._release = release
        self._stopping = stopping
        self.log = log
        self.block_ms = block_ms  # the longest blocking read (SPLATQ_FETCH_BLOCK_MS)
        self.metrics = metrics
        self._slot_freed = asyncio.Event()
        self._rotation = 0
        # The last take was cut short by the next stage's backpressure bound.
        self._held = False

    def slot_freed(self) -> None:
        """A slot of the pool was given back: a fetch loop waiting for one looks again."""
        self._slot_freed.set()

    async def run(self) -> None:
        while not self._stopping.is_set():
            if not self.pool.has_capacity():
                self._slot_freed.clear()
                await self.wait_or_stop(self._slot_freed.wait())
                # Jobs committed in one batch resume together: let them all release their
                # slots before fetching, so the next read and start are one batch too.
                await asyncio.sleep(0)
                continue
            try:
                await self.fetch_once()
            except REDIS_ERRORS as exc:
                self.log.warning("fetch.redis_unavailable", error=str(exc))
                await self.wait_or_stop(asyncio.sleep(0.5))
            except ResponseError as exc:
                # OOM, READONLY, a script error: the worker keeps its running jobs and tries
                # again, instead of dying with their results.
                self.log.error(
                    "fetch.error_reply", error=str(exc)[:300], transient=is_transient_reply(exc)
                )
                if self.metrics is not None:
                    self.metrics.error_replies.labels("fetch", error_reply_kind(exc)).inc()
                await self.wait_or_stop(asyncio.sleep(ERROR_REPLY_BACKOFF_S))

    async def wait_or_stop(self, aw: Awaitable[Any], timeout_s: float | None = None) -> None:
        waiter = asyncio.ensure_future(aw)
        stopper = asyncio.ensure_future(self._stopping.wait())
        await asyncio.wait(
            {waiter, stopper}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
        for f in (waiter, stopper):
            f.cancel()

    async def fetch_once(self) -> int:
        """Reap, then take new work for the free slots; when there is none, wait.
        Returns how many entries were consumed (started or disposed of)."""
        consumed = 0
        drained = set(STREAMS)  # the classes every take found with nothing more ready
        for partition in self._partition_order():
            for stream in self.pool.serves:
                capacity = self.pool.capacity(stream)
                if capacity and self.reaper.is_due(partition, stream):
                    taken = await self.reaper.reap_stale_entries(partition, stream, capacity)
                    consumed += len(taken)
                    if taken:
                        drained.discard(stream)
                    await self.start(taken)
            took, dry = await self._take(partition)
            consumed += took
            drained &= dry
        room = [s for s in self.pool.serves if self.pool.capacity(s) and s not in drained]
        if (consumed and room) or self._stopping.is_set():
            return consumed
        # Nothing taken, or the classes with room have nothing ready: wait as below (taking
        # again now was an empty take.lua call after every batch).
        if self._held:
            # The next stage is full: a blocking read would take past its bound, so look
            # again shortly (or when a slot frees) instead.
            self._held = False
            self._slot_freed.clear()
            await self.wait_or_stop(self._slot_freed.wait(), timeout_s=IDLE_POLL_S)
            return 0
        if not self.pool.waits_on_all():
            # A stream is saturated, the others have nothing to do: a blocking read on them
            # would hold us past the saturated one's next free slot; wait for a slot.
            self._slot_freed.clear()
            await self.wait_or_stop(self._slot_freed.wait(), timeout_s=IDLE_POLL_S)
            return 0
        # Nothing anywhere and room on every stream: block on one partition for new entries
        # (one per stream; the next take reads the rest).
        block_ms = self.block_ms
        if len(self.partitions) > 1:
            block_ms = min(block_ms, int(IDLE_POLL_S * 1000))
        partition = self.partitions[self._rotation % len(self.partitions)]
        consumer = self.member.name
        return await self.start(
            await self.queue.wait_for_new(partition, self.pool.serves, consumer, block_ms)
        )

    def _partition_order(self) -> list[int]:
        self._rotation += 1
        k = self._rotation % len(self.partitions)
        return list(self.partitions[k:] + self.partitions[:k])

    async def _take(self, partition: int) -> tuple[int, set[StreamName]]:
        """Read and start new entries for the free slots (take.lua: one round trip): how many
        it consumed (duplicates, dead letters included), and the classes it found drained."""
        drained: set[StreamName] = set()
        if not self.pool.has_capacity():
            return 0, set(STREAMS)
        taken = await self.queue.take(
            partition,
            self.pool.guaranteed_counts(),
            self.pool.lendable,
            self.member.name,
            resend_for_s=RESEND_WINDOW_S,
            running=self.member.running(),
        )
        markers = 0
        for t in taken:
            if t.outcome in (Reply.HELD, Reply.DRAINED):
                if t.outcome == Reply.HELD:
                    self._held = True
                else:
                    drained.add(t.entry.stream)
                markers += 1
                continue
            if self.metrics is not None:
                self.metrics.deliveries.labels(t.entry.stream.value, t.outcome).inc()
            if t.outcome == Reply.STARTED and t.job is not None:
                self.pool.acquire(t.entry.stream)
                self._launch(t.entry, t.token, t.job)
            elif t.outcome == Reply.RAW:
                problem = entry_problem(t.entry.fields, partition)
                await self.reaper.dead_letter_entry(
                    t.entry, *(problem or (UNKNOWN_JOB, "no job record for this entry"))
                )
            else:
                await self._unstarted.handle(t.entry, t.token, t.outcome, t.detail)
        return len(taken) - markers, drained

    async def start(self, entries: list[StreamEntry]) -> int:
        """Lease and start delivered entries; malformed ones go to the dead-letter stream."""
        if not entries:
            return 0
        valid: list[StreamEntry] = []
        for entry in entries:
            problem = entry_problem(entry.fields, entry.partition)
            if problem is not None:
                await self.reaper.dead_letter_entry(entry, *problem)
                continue
            valid.append(entry)
            self.pool.acquire(entry.stream)
        tokens = [secrets.token_hex(12) for _ in valid]
        try:
            results = await self.queue.start_many(
                valid,
                tokens,
                self.member.name,
                resend_for_s=RESEND_WINDOW_S,
                running=self.member.running() + len(valid),
            )
        except REDIS_ERRORS:
            # Unknown whether the scripts ran: the entries stay pending and any lease taken
            # expires, so the reaper recovers them. Only the slots are ours to give back.
            for entry in valid:
                self._release(entry.stream)
            raise
        started = 0
        for entry, token, result in zip(valid, tokens, results, strict=True):
            if self.metrics is not None:
                self.metrics.deliveries.labels(entry.stream.value, result.outcome).inc()
            if result.outcome == Reply.STARTED and result.job is not None:
                self._launch(entry, token, result.job)
                started += 1
                continue
            self._release(entry.stream)
            await self._unstarted.handle(entry, token, result.outcome, result.detail)
        return started
