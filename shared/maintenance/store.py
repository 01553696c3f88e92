"""The task lock, checkpoint and history in Redis: a thin layer over task_claim.lua,
task_renew.lua and task_finish.lua (each inside its task's `{task:<name>}` slot)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from splatq.shared.engine.queue_types import raise_on_error
from splatq.shared.engine.scripts import ScriptCall, ScriptRunner
from splatq.shared.maintenance.keys import MaintenanceKeys
from splatq.shared.maintenance.scripts import MaintenanceScript

HISTORY_MAXLEN = 200
FAILURE_BACKOFF_MS = 30_000


class Trigger(StrEnum):
    SCHEDULE = "schedule"
    MANUAL = "manual"


class Outcome(StrEnum):
    SUCCESS = "success"
    FAILURE = "failure"
    INTERRUPTED = "interrupted"  # the process is stopping: the next holder resumes at once


@dataclass(frozen=True, slots=True)
class Claim:
    """A claimed run: its fenced token, and the checkpoint it resumes from ('' = start)."""

    task: str
    token: str
    fence: str
    checkpoint: str
    resumed: bool


@dataclass(frozen=True, slots=True)
class Refusal:
    why: str  # busy | done | backoff
    detail: str


@dataclass(frozen=True, slots=True)
class TaskState:
    last_success_ms: int
    last_failure_ms: int
    last_slot_ms: int
    running: bool
    run_holder: str
    checkpoint: str

    @classmethod
    def from_hash(cls, f: dict[str, str]) -> TaskState:
        def num(name: str) -> int:
            raw = f.get(name) or "0"
            return int(raw) if raw.lstrip("-").isdigit() else 0

        return cls(
            last_success_ms=num("last_success_ms"),
            last_failure_ms=num("last_failure_ms"),
            last_slot_ms=num("last_slot_ms"),
            running=f.get("running") == "1",
            run_holder=f.get("run_holder", ""),
            checkpoint=f.get("checkpoint", ""),
        )


class TaskStore:
    def __init__(self, redis: Any, scripts: ScriptRunner, keys: MaintenanceKeys) -> None:
        self.redis = redis
        self.scripts = scripts
        scripts.register(MaintenanceScript)
        self.keys = keys

    async def claim(
        self, task: str, holder: str, ttl_ms: int, slot_ms: int, trigger: Trigger
    ) -> Claim | Refusal:
        reply = await self.scripts.run(
            ScriptCall(
                MaintenanceScript.TASK_CLAIM,
                [self.keys.task_lock(task), self.keys.task_state(task)],
                [holder, ttl_ms, slot_ms, trigger.value],
            ),
            resend_for_s=5.0,
        )
        raise_on_error(reply)
        if reply[0] != "claimed":
            return Refusal(str(reply[0]), str(reply[1]))
        return Claim(task, str(reply[1]), str(reply[2]), str(reply[3]), reply[4] == "1")

    async def renew(self, claim: Claim, ttl_ms: int, checkpoint: str | None = None) -> bool:
        """Keep the lock (and save `checkpoint`); False when the run was taken over."""
        reply = await self.scripts.run(
            ScriptCall(
                MaintenanceScript.TASK_RENEW,
                [self.keys.task_lock(claim.task), self.keys.task_state(claim.task)],
                [
                    claim.token,
                    claim.fence,
                    ttl_ms,
                    "0" if checkpoint is None else "1",
                    checkpoint or "",
                ],
            ),
            resend_for_s=5.0,
        )
        raise_on_error(reply)
        return bool(int(reply))

    async def finish(self, claim: Claim, outcome: Outcome, summary: str) -> bool:
        reply = await self.scripts.run(
            ScriptCall(
                MaintenanceScript.TASK_FINISH,
                [
                    self.keys.task_lock(claim.task),
                    self.keys.task_state(claim.task),
                    self.keys.task_history(claim.task),
                ],
                [
                    claim.token,
                    claim.fence,
                    outcome.value,
                    summary[:2000],
                    HISTORY_MAXLEN,
                    FAILURE_BACKOFF_MS,
                ],
            ),
            resend_for_s=5.0,
        )
        raise_on_error(reply)
        return bool(reply[0] == "ok")

    async def state(self, task: str) -> TaskState:
        return TaskState.from_hash(await self.redis.hgetall(self.keys.task_state(task)))

    async def history(self, task: str, count: int = 20) -> list[dict[str, str]]:
        """The latest runs, newest first."""
        entries = await self.redis.xrevrange(self.keys.task_history(task), count=count)
        return [{"id": str(eid), **dict(fields)} for eid, fields in entries]
