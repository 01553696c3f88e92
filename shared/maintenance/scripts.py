"""Scheduled maintenance's Lua scripts (`shared/maintenance/lua/`): a task's lease (claim,
renew, finish) and the redriver's audit notes on dead letters. Registered with the job
store's script runner by the stores that use them; every one is memoized (a resend answers
what the first execution did)."""

from __future__ import annotations

from splatq.shared.engine.scripts import LuaScript


class MaintenanceScript(LuaScript):
    TASK_CLAIM = "task_claim"
    TASK_RENEW = "task_renew"
    TASK_FINISH = "task_finish"
    DLQ_NOTE = "dlq_note"

    @classmethod
    def package(cls) -> str:
        return "splatq.shared.maintenance"
