"""A worker's runs and their leases: `Run` (one job being run here: its context, its task,
whether its outcome is being committed, when its lease was last renewed) and `LeaseKeeper`,
which renews every run's lease in one pipelined call per heartbeat tick and stops a run that
no longer holds its job (another worker took it over, or a newer run of it started here). A
renewal Redis cannot answer is unknown, not lost: the run goes on, and the next renewal
comes sooner."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import structlog

from splatq.shared.engine.fleet import FleetMember
from splatq.shared.engine.job_context import JobContext
from splatq.shared.engine.metrics import EngineMetrics
from splatq.shared.engine.queue_types import RENEW_UNKNOWN
from splatq.shared.engine.runs import Runs
from splatq.shared.settings import Settings


@dataclass(slots=True)
class Run:
    ctx: JobContext
    task: asyncio.Task[None] | None = None
    # Set once the outcome is handed to the committer: from then on the commit's own fence
    # decides, and a renewal racing the commit's DEL of the lease means nothing.
    committing: bool = False
    started_at: float = field(default_factory=time.monotonic)
    renewed_at: float = field(default_factory=time.monotonic)


class LeaseKeeper:
    def __init__(
        self,
        runs: Runs,
        settings: Settings,
        member: FleetMember,
        running: dict[str, Run],
        metrics: EngineMetrics | None,
    ) -> None:
        self.queue = runs
        self.settings = settings
        self.member = member
        self._running = running  # the worker's own table of its runs, by job id
        self.metrics = metrics
        self.log = structlog.get_logger("splatq.worker").bind(consumer=member.name)

    async def run(self) -> None:
        """Renew every lease of this worker in one pipelined call per tick."""
        interval = self.settings.heartbeat_interval_s
        ttl_s = self.settings.lease_ttl_ms / 1000
        # After a failed renewal the next one comes sooner: the first renewal once Redis is
        # back is what keeps the jobs (reclaim.lua grants a lease TTL after an outage ends).
        pause = interval
        while True:
            await asyncio.sleep(pause)
            pause = interval
            running = list(self._running.values())
            if not running:
                continue
            leases = [
                (r.ctx.job.id, r.ctx.stream, r.ctx.entry.entry_id, r.ctx.token) for r in running
            ]
            try:
                replies = await self.queue.renew_many(
                    leases, self.member.name, running=self.member.running()
                )
            except Exception as exc:
                # Unknown, not lost: while Redis cannot answer, the jobs keep running. When it
                # answers again, renew re-takes each lapsed lease nobody else took, and says
                # 'lost' for the ones another worker took over (those then stop).
                if self.metrics is not None:
                    self.metrics.lease_renewal_failures.labels(type(exc).__name__).inc(len(running))
                now = time.monotonic()
                self.log.warning(
                    "lease.renew_failed",
                    error=str(exc)[:300],
                    jobs=len(running),
                    unconfirmed=sum(now - r.renewed_at > ttl_s for r in running),
                )
                pause = min(interval, 0.1)
                continue
            now = time.monotonic()
            for r, reply in zip(running, replies, strict=True):
                if reply == RENEW_UNKNOWN:
                    if self.metrics is not None:
                        self.metrics.lease_renewal_failures.labels("error_reply").inc()
                    continue
                if reply == 0:
                    self.lose(r, "not_holder")
                else:
                    r.renewed_at = now
                    if reply == 2 and not r.ctx.cancel_requested:
                        r.ctx.cancel_requested = True
                        r.ctx.log.info("job.cancel_observed")

    def lose(self, running: Run, reason: str, *, force: bool = False) -> None:
        """Stop a run that no longer holds its job. A committing run is left to its commit's
        own fence unless `force` (a newer run of the job replaces it here)."""
        if running.ctx.lease_lost or (running.committing and not force):
            return
        running.ctx.lease_lost = True
        if self.metrics is not None:
            self.metrics.lease_renewal_failures.labels(reason).inc()
        running.ctx.log.error("lease.lost", reason=reason)
        if running.task is not None:
            running.task.cancel()
