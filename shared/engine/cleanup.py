"""The cleanup stage: delete a finished staged job's intermediates.

A staged job's terminal commit (completed or canceled) adds an entry to its partition's cleanup
stream of its class in the same step (`stage_cleanup` in lua/_preamble.lua). This consumer reads
those entries through its own consumer group, deletes the job's `intermediates/<job>/` objects
(idempotent) and then, in one script, records the cleanup in the job's ledger and acks the entry.
A consumer that dies mid-way leaves its entries pending; any cleanup consumer takes them over
with XAUTOCLAIM once they have been idle for `claim_idle_ms`. An entry that keeps failing is
given up after `max_deliveries` (its objects are left to the storage retention).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

import structlog
from redis.exceptions import ResponseError

from splatq.shared.engine.fleet import REDIS_ERRORS, new_consumer_name
from splatq.shared.engine.ids import is_job_id
from splatq.shared.engine.metering import UNIT_DIGEST_CHARS
from splatq.shared.engine.metrics import EngineMetrics
from splatq.shared.engine.queue import JobQueue
from splatq.shared.engine.scripts import Script, ScriptCall
from splatq.shared.engine.stages import PipelineStage, StageRecord, StageStatus
from splatq.shared.engine.worker_classes import parse_class_list

log = structlog.get_logger("splatq.cleanup")

Cleaner = Callable[[str], Awaitable[int]]
READ_COUNT = 16


class CleanupWorker:
    """Consumes the cleanup streams of the owned partitions."""

    def __init__(
        self,
        queue: JobQueue,
        cleaner: Cleaner,
        metrics: EngineMetrics | None = None,
        consumer: str | None = None,
        claim_idle_ms: int = 60_000,
    ) -> None:
        self.queue = queue.for_stage(PipelineStage.CLEANUP)
        self.cleaner = cleaner
        self.metrics = metrics
        self.consumer = consumer or new_consumer_name()
        self.claim_idle_ms = claim_idle_ms
        self.partitions = queue.settings.owned_partitions
        # A per-class process cleans its own class's jobs (worker_classes.py).
        self.classes = parse_class_list(queue.settings.worker_classes)
        self.max_deliveries = queue.settings.max_deliveries
        self.block_ms = queue.settings.fetch_block_ms
        self._stopping = asyncio.Event()
        self.cleaned = 0

    def stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        while not self._stopping.is_set():
            try:
                await self.queue.setup()
                break
            except (*REDIS_ERRORS, ResponseError) as exc:
                log.warning("cleanup.setup_waiting_for_redis", error=str(exc)[:300])
                await self._pause(1.0)
        next_claim = 0.0
        while not self._stopping.is_set():
            try:
                done = 0
                if time.monotonic() >= next_claim:
                    done += await self._reclaim()
                    next_claim = time.monotonic() + self.claim_idle_ms / 4000
                done += await self._read(block=False)
                if not done:
                    await self._read(block=True)
            except REDIS_ERRORS as exc:
                log.warning("cleanup.redis_unavailable", error=str(exc)[:300])
                await self._pause(0.5)
            except ResponseError as exc:
                log.error("cleanup.error_reply", error=str(exc)[:300])
                await self._pause(1.0)

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

    async def _read(self, block: bool) -> int:
        done = 0
        for p in self.partitions:
            streams = {self.queue.keys.stream(p, s): ">" for s in self.classes}
            reply = await self.queue.redis.xreadgroup(
                self.queue.group,
                self.consumer,
                streams,  # type: ignore[arg-type]
                count=READ_COUNT,
                block=min(self.block_ms, 500) if block else None,
            )
            for key, entries in reply or []:
                for entry_id, fields in entries:
                    await self._clean(str(key), str(entry_id), dict(fields or {}), 1)
                    done += 1
        return done

    async def _reclaim(self) -> int:
        done = 0
        for p in self.partitions:
            for s in self.classes:
                key = self.queue.keys.stream(p, s)
                reply = await self.queue.redis.xautoclaim(
                    key, self.queue.group, self.consumer, self.claim_idle_ms, "0-0", READ_COUNT
                )
                for entry_id, fields in reply[1] if reply else []:
                    if fields is None:
                        continue
                    pending = await self.queue.redis.xpending_range(
                        key, self.queue.group, entry_id, entry_id, 1
                    )
                    times = int(pending[0]["times_delivered"]) if pending else 1
                    await self._clean(key, str(entry_id), dict(fields), times)
                    done += 1
        return done

    async def _clean(self, key: str, entry_id: str, fields: dict[str, str], times: int) -> None:
        job_id = fields.get("job", "")
        started_ms = int(time.time() * 1000)
        if not is_job_id(job_id):
            log.error("cleanup.bad_entry", entry_id=entry_id, fields=str(fields)[:200])
            await self._ack(key, entry_id)
            return
        try:
            deleted = await self.cleaner(job_id)
        except Exception as exc:
            if times >= self.max_deliveries:
                log.error("cleanup.given_up", job_id=job_id, error=str(exc)[:300], times=times)
                self._count("given_up")
                await self._ack(key, entry_id)
            else:
                # Left pending: taken over again after claim_idle_ms.
                log.warning("cleanup.failed", job_id=job_id, error=str(exc)[:300], times=times)
                self._count("failed")
            return
        record = StageRecord(
            status=StageStatus.SUCCEEDED,
            attempts=times,
            started_at_ms=started_ms,
            finished_at_ms=int(time.time() * 1000),
            facts={"deleted": str(deleted)},
        )
        await self.queue.scripts.run(
            ScriptCall(
                Script.CLEANUP_DONE,
                [self.queue.keys.job(job_id), key],
                [self.queue.group, entry_id, record.to_json(), UNIT_DIGEST_CHARS],
            ),
            resend_for_s=5.0,
        )
        self.cleaned += 1
        self._count("succeeded")
        log.info("cleanup.done", job_id=job_id, deleted=deleted, stage="cleanup")

    async def _ack(self, key: str, entry_id: str) -> None:
        pipe = self.queue.redis.pipeline(transaction=False)
        pipe.xack(key, self.queue.group, entry_id)
        pipe.xdel(key, entry_id)
        await pipe.execute()

    def _count(self, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.stage_runs.labels("cleanup", "all", outcome).inc()
