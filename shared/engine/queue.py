"""The job store: every read and write of jobs, streams, leases and claims, over the Lua
scripts (`shared/engine/lua/`). Policy (what to retry, when to reap) lives with the callers.
Every multi-key call stays in one `{pN}` slot.

Each caller has a role of its own, over one shared `Backend` (shared/engine/backend.py):
`Producers` (the gateway, clients), `Runs` (workers), `Recovery` (the reaper, the redriver,
operators) and `StreamReads` (metrics, the console, `splatq info`). `JobQueue` is all four
at once over one backend, for a process that plays several parts (a worker runs and
recovers; tests); a caller that needs one part takes that role.
"""

from __future__ import annotations

import copy

from redis.asyncio import Redis

from splatq.shared.engine.backend import Backend
from splatq.shared.engine.producers import Producers
from splatq.shared.engine.queue_types import (
    PARKING_CONSUMER,
    RENEW_UNKNOWN,
    Advance,
    ClaimResult,
    DeadLetter,
    EnqueueResult,
    Finish,
    StartResult,
    StreamEntry,
    StreamStats,
    Taken,
    WaitingStats,
    delayed_member,
    parse_dead_letter_id,
    parse_delayed_member,
)
from splatq.shared.engine.recovery import Recovery
from splatq.shared.engine.runs import Runs
from splatq.shared.engine.stages import PipelineStage
from splatq.shared.engine.stream_reads import StreamReads
from splatq.shared.settings import Settings

__all__ = [
    "PARKING_CONSUMER",
    "RENEW_UNKNOWN",
    "Advance",
    "Backend",
    "ClaimResult",
    "DeadLetter",
    "EnqueueResult",
    "Finish",
    "JobQueue",
    "StartResult",
    "StreamEntry",
    "StreamStats",
    "Taken",
    "WaitingStats",
    "delayed_member",
    "parse_dead_letter_id",
    "parse_delayed_member",
]


class JobQueue(Producers, Runs, Recovery, StreamReads):
    """Every role over one backend (see the module docstring)."""

    def __init__(self, redis: Redis, settings: Settings, backend: Backend | None = None) -> None:
        super().__init__(backend or Backend.open(redis, settings))

    def for_stage(self, stage: PipelineStage) -> JobQueue:
        """This queue (same connection and scripts) reading the work streams of `stage`."""
        other = copy.copy(self)
        other.backend = self.backend.for_stage(stage)
        return other

    async def setup(self) -> None:
        """Load scripts and create every consumer group (idempotent; safe on every start)."""
        await self.backend.setup()
