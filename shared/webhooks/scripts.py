"""The webhooks' Lua scripts (`shared/webhooks/lua/`): the delivery outbox (fan-out, claim,
result, redrive), the tenant's signing secret and the endpoints (create, update, rotate,
delete, the circuit breaker's gate and health, the delivery log). Registered with the job
store's script runner by the stores that use them."""

from __future__ import annotations

from splatq.shared.engine.scripts import LuaScript


class WebhookScript(LuaScript):
    WH_FANOUT = "wh_fanout"
    # Finds and claims a partition's due messages, many per call (its own compact memo).
    WH_CLAIM_DUE = "wh_claim_due"
    # Records many results of one partition per call (wh_result.lua's logic per message).
    WH_RESULT_BATCH = "wh_result_batch"
    WH_REDRIVE = "wh_redrive"
    WH_SECRET_ROTATE = "wh_secret_rotate"
    WH_EP_CREATE = "wh_ep_create"
    WH_EP_UPDATE = "wh_ep_update"
    WH_EP_ROTATE = "wh_ep_rotate"
    WH_EP_DELETE = "wh_ep_delete"
    WH_EP_GATE = "wh_ep_gate"
    # A batch's health outcomes and attempt log for one endpoint (wh_ep_health.lua and
    # wh_ep_log.lua, included).
    WH_EP_RECORD = "wh_ep_record"

    @classmethod
    def package(cls) -> str:
        return "splatq.shared.webhooks"

    @property
    def replay_safe(self) -> bool:
        # The endpoint gate is a pure compare-and-set: a resend answers the same. The claim
        # keeps a replay memo of its own, of message ids, not payloads (wh_claim_due.lua).
        return self in (WebhookScript.WH_EP_GATE, WebhookScript.WH_CLAIM_DUE)
