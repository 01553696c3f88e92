"""A worker's periodic upkeep of the partitions it owns: delayed retries that came due go back
to their streams, the queue gauges are sampled (by one worker per process), and consumers idle
for an hour are pruned from the consumer groups. A round Redis cannot answer is logged and
tried again at the next interval."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from splatq.shared.engine.fleet import REDIS_ERRORS
from splatq.shared.engine.keys import STREAMS
from splatq.shared.engine.metrics import EngineMetrics
from splatq.shared.engine.queue import JobQueue

CONSUMER_PRUNE_IDLE_MS = 3_600_000
SAMPLE_EVERY_S = 5.0
PRUNE_EVERY_S = 600.0


class Upkeep:
    def __init__(
        self,
        queue: JobQueue,
        partitions: tuple[int, ...],
        interval_s: float,
        metrics: EngineMetrics | None,
        sample_queues: bool,
        log: Any,
    ) -> None:
        self.queue = queue
        self.partitions = partitions
        self.interval_s = interval_s
        self.metrics = metrics
        self.sample_queues = sample_queues
        self.log = log

    async def run(self) -> None:
        next_sample = next_prune = 0.0
        while True:
            try:
                for p in self.partitions:
                    await self.queue.promote_due(p)
                now = time.monotonic()
                if self.metrics is not None and self.sample_queues and now >= next_sample:
                    await self.metrics.sample_queues(
                        self.queue, self.partitions, staged=self.queue.stage is not None
                    )
                    next_sample = now + SAMPLE_EVERY_S
                if now >= next_prune:
                    for p in self.partitions:
                        for s in STREAMS:
                            await self.queue.prune_consumers(p, s, CONSUMER_PRUNE_IDLE_MS)
                    next_prune = now + PRUNE_EVERY_S
            except REDIS_ERRORS as exc:
                self.log.warning("maintenance.redis_unavailable", error=str(exc))
            except Exception:
                self.log.exception("maintenance.failed")
            await asyncio.sleep(self.interval_s)
