"""The circuit breaker's gates for a claim's messages to registered endpoints.

A gate (wh_ep_gate.lua) says whether messages to one endpoint may be sent now, where, and
signed with what, and takes the half-open probe when one is due. For endpoints it has seen
before, the dispatcher *peeks* at their gates in the claim's own round trip: a peek writes
nothing and answers for every state in which the gate itself would write nothing (a closed
circuit, an open one still cooling down, a disabled or deleted endpoint); where the gate
would take the probe it answers `ask`. What a peek did not answer is gated after the claim,
one call per endpoint in one round trip, after the dispatcher's share checks -- so a message
that waits anyway never takes the probe.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from splatq.shared.engine.scripts import ScriptCall, ScriptRunner
from splatq.shared.webhooks.endpoints import EndpointStore, Gate
from splatq.shared.webhooks.store import Message

# Endpoints whose tenant is remembered (from claimed messages) before the memory starts over.
ENDPOINT_TENANTS_KEPT = 10_000

Endpoint = tuple[str, str]  # (tenant, endpoint id)


class Gatekeeper:
    def __init__(
        self, endpoints: EndpointStore, scripts: ScriptRunner, kept: int = ENDPOINT_TENANTS_KEPT
    ) -> None:
        self.endpoints = endpoints
        self.scripts = scripts
        self._kept = kept
        # Endpoint id -> its tenant, as seen on claimed messages (it never changes).
        self._tenant_of: dict[str, str] = {}

    def peek_calls(self, ids: Sequence[str], peeked: list[Endpoint]) -> list[ScriptCall]:
        """Peeks for the candidates' endpoints whose tenant is known (an endpoint message's
        id ends in its endpoint id), noted in `peeked` in call order: they go in the claim's
        round trip, so a batch to endpoints with closed circuits is claimed, gated and sent
        after one round trip, not two."""
        for message_id in ids:
            endpoint_id = message_id.rpartition(":")[2]
            tenant = self._tenant_of.get(endpoint_id)
            if tenant is not None and (tenant, endpoint_id) not in peeked:
                peeked.append((tenant, endpoint_id))
        return [self.endpoints.gate_call(t, e, peek=True) for t, e in peeked]

    def remember(self, claimed: Iterable[Message]) -> None:
        for m in claimed:
            if m.endpoint_id:
                if len(self._tenant_of) >= self._kept:
                    self._tenant_of.clear()  # rebuilt from the next claims
                self._tenant_of[m.endpoint_id] = m.tenant

    async def gates(
        self, messages: list[Message], peeks: Mapping[Endpoint, Any]
    ) -> dict[str, Gate]:
        """Each endpoint message's gate, by message id: from the peek taken for its very
        (tenant, endpoint) where that peek answered, else from one gate call per endpoint,
        all in one round trip (which may take the half-open probe)."""
        groups: dict[Endpoint, list[Message]] = {}
        for m in messages:
            if m.endpoint_id:
                groups.setdefault((m.tenant, m.endpoint_id), []).append(m)
        gates: dict[str, Gate] = {}
        for group, members in list(groups.items()):
            peek = peeks.get(group)
            peeked = None if peek is None or isinstance(peek, Exception) else (
                self.endpoints.parse_gate(peek, len(members)))  # fmt: skip
            if peeked is not None:
                gates.update((m.id, gate) for m, gate in zip(members, peeked, strict=True))
                del groups[group]
        if not groups:
            return gates
        replies = await self.scripts.run_many(
            [self.endpoints.gate_call(tenant, endpoint_id) for tenant, endpoint_id in groups]
        )
        for members, reply in zip(groups.values(), replies, strict=True):
            if isinstance(reply, Exception):
                raise reply
            verdicts = self.endpoints.parse_gate(reply, len(members))
            if verdicts is None:  # only a peek answers ASK
                raise RuntimeError("wh_ep_gate answered 'ask' to a gate call")
            gates.update((m.id, gate) for m, gate in zip(members, verdicts, strict=True))
        return gates
