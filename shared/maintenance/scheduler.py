"""Runs scheduled tasks: each due slot is claimed with a fenced lease lock (one holder across
every replica), the body runs while a heartbeat renews the lock, and its checkpoints are saved
through the same fence. A run whose fence is lost (a stall past the TTL, and another replica
claimed the task) is cancelled before it writes another checkpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import structlog

from splatq.shared.maintenance.schedule import Schedule
from splatq.shared.maintenance.store import Claim, Outcome, Refusal, TaskStore, Trigger

log = structlog.get_logger("splatq.tasks")


class RunLost(Exception):
    """The run's fence is no longer the task's: another holder took it over."""


class TaskRun:
    """What a task body sees: where to resume, and a fenced way to record progress."""

    def __init__(self, store: TaskStore, claim: Claim, ttl_ms: int) -> None:
        self._store = store
        self._claim = claim
        self._ttl_ms = ttl_ms
        self.checkpoint = claim.checkpoint
        self.resumed = claim.resumed

    async def save(self, checkpoint: str) -> None:
        """Record a finished batch (and renew the lock); raises RunLost when fenced out."""
        if not await self._store.renew(self._claim, self._ttl_ms, checkpoint):
            raise RunLost(self._claim.task)
        self.checkpoint = checkpoint


class Task(Protocol):
    """A scheduled task: a name, a cron schedule, and a body that works in checkpointed
    batches and returns a one-line summary of what it did."""

    @property
    def name(self) -> str: ...

    @property
    def schedule(self) -> Schedule: ...

    async def run(self, run: TaskRun) -> str: ...


@dataclass(frozen=True, slots=True)
class RunResult:
    task: str
    outcome: Outcome
    summary: str
    duration_s: float


OnResult = Callable[[RunResult], None]


class Scheduler:
    def __init__(
        self,
        store: TaskStore,
        tasks: Sequence[Task],
        holder: str,
        lock_ttl_ms: int,
        poll_s: float,
        on_result: OnResult | None = None,
    ) -> None:
        self.store = store
        self.tasks: Mapping[str, Task] = {t.name: t for t in tasks}
        self.holder = holder
        self.lock_ttl_ms = lock_ttl_ms
        self.poll_s = poll_s
        self._on_result = on_result
        self._running: dict[str, asyncio.Task[RunResult | None]] = {}
        self._stop = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    async def run_forever(self) -> None:
        """Claim and run due slots until stop(); then interrupt running bodies (their
        checkpoints stay for the next holder, who may claim at once)."""
        try:
            while not self._stop.is_set():
                try:
                    await self.tick()
                except Exception:  # Redis away: try again next poll
                    log.exception("tasks.tick_failed")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), self._wait_s())
        finally:
            for running in list(self._running.values()):
                running.cancel()
            await asyncio.gather(*self._running.values(), return_exceptions=True)

    def _wait_s(self) -> float:
        """Until the next slot of any task, at most poll_s (a crashed holder's lock expires
        without notice: polling finds its slot claimable again)."""
        now = time.time()
        soonest = min((t.schedule.next_slot(now) for t in self.tasks.values()), default=now)
        return max(0.01, min(self.poll_s, soonest - now))

    async def tick(self) -> None:
        """Start every task whose latest slot is not covered yet (and that is not already
        running here)."""
        now = time.time()
        for name, task in self.tasks.items():
            if name in self._running:
                continue
            slot_ms = int(task.schedule.latest_slot(now) * 1000)
            claim = await self.store.claim(
                name, self.holder, self.lock_ttl_ms, slot_ms, Trigger.SCHEDULE
            )
            if isinstance(claim, Refusal):
                continue
            running = asyncio.create_task(self.execute(task, claim))
            self._running[name] = running
            running.add_done_callback(self._forget(name))

    def _forget(self, name: str) -> Callable[[asyncio.Task[RunResult | None]], None]:
        def forget(_: asyncio.Task[RunResult | None]) -> None:
            self._running.pop(name, None)

        return forget

    async def run_now(self, name: str) -> RunResult | Refusal:
        """A manual run (`splatq tasks run`): same lock, same checkpoints; it covers no slot."""
        task = self.tasks[name]
        slot_ms = int(time.time() * 1000)
        claim = await self.store.claim(name, self.holder, self.lock_ttl_ms, slot_ms, Trigger.MANUAL)
        if isinstance(claim, Refusal):
            return claim
        result = await self.execute(task, claim)
        assert result is not None
        return result

    async def execute(self, task: Task, claim: Claim) -> RunResult | None:
        bound = log.bind(task=task.name, run=claim.token)
        bound.info("task.started", resumed_from=claim.checkpoint or None)
        started = time.monotonic()
        run = TaskRun(self.store, claim, self.lock_ttl_ms)
        lost = asyncio.Event()
        body = asyncio.create_task(task.run(run))
        beat = asyncio.create_task(self._heartbeat(claim, body, lost))
        outcome, summary = Outcome.SUCCESS, ""
        try:
            summary = await body
        except RunLost:
            lost.set()
        except asyncio.CancelledError:
            if not lost.is_set():  # this process is stopping, not fenced out
                outcome, summary = Outcome.INTERRUPTED, f"stopped at {run.checkpoint or 'start'}"
        except Exception as exc:
            bound.exception("task.failed")
            outcome, summary = Outcome.FAILURE, f"{type(exc).__name__}: {exc}"
        finally:
            beat.cancel()
            if not body.done():
                body.cancel()
        if lost.is_set():
            bound.warning("task.fenced_out", checkpoint=run.checkpoint)
            return None
        await asyncio.shield(self.store.finish(claim, outcome, summary))
        result = RunResult(task.name, outcome, summary, time.monotonic() - started)
        bound.info("task.finished", outcome=outcome.value, summary=summary,
                   duration_s=round(result.duration_s, 3))  # fmt: skip
        if self._on_result is not None:
            self._on_result(result)
        if outcome is Outcome.INTERRUPTED:
            raise asyncio.CancelledError
        return result

    async def _heartbeat(self, claim: Claim, body: asyncio.Task[str], lost: asyncio.Event) -> None:
        """Renew every TTL/3; on a lost fence mark it and cancel the body."""
        while True:
            await asyncio.sleep(self.lock_ttl_ms / 3000)
            try:
                held = await self.store.renew(claim, self.lock_ttl_ms)
            except Exception:
                log.warning("task.renew_failed", task=claim.task, exc_info=True)
                continue
            if not held:
                lost.set()
                body.cancel()
                return
