"""Redrive policies, and what one says about one dead letter (pure: no I/O, no clock).

A policy matches a kind (jobs, webhook messages) and reason codes; the first match in the
file's order decides. `redrive` acts once the entry is older than its delay (and, when it asks
for it, once the circuit of a webhook message's endpoint or of a hosted-model job's vendor is
closed) while its subject has budget left; `hold` leaves the entry for a person. An entry no
policy matches is held.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from splatq.shared.maintenance.keys import DeadLetterKind

ANY_CODE = "*"


class Action(StrEnum):
    REDRIVE = "redrive"
    HOLD = "hold"


class Requirement(StrEnum):
    NONE = "none"
    CIRCUIT_CLOSED = "circuit_closed"


class Verdict(StrEnum):
    REDRIVE = "redrive"
    WAIT = "wait"  # not yet: its delay, or its endpoint's circuit
    HOLD = "hold"  # a person decides
    EXHAUSTED = "exhausted"  # its redrive budget is spent: held for a person


@dataclass(frozen=True, slots=True)
class Policy:
    name: str
    kind: DeadLetterKind
    codes: frozenset[str]
    action: Action
    delay_ms: int = 0
    budget: int = 3
    require: Requirement = Requirement.NONE
    # Job fields a redrive sets (e.g. a smaller batch for a job that ran out of memory).
    hint: Mapping[str, str] = field(default_factory=dict)

    def matches(self, kind: DeadLetterKind, codes: frozenset[str]) -> bool:
        return self.kind is kind and (ANY_CODE in self.codes or bool(self.codes & codes))


@dataclass(frozen=True, slots=True)
class LetterView:
    """What a decision needs to know of one dead letter."""

    kind: DeadLetterKind
    # The entry's reason, and its subject's last error code when known.
    codes: frozenset[str]
    at_ms: int
    redrives: int  # redrives its subject (a job, a message) already had
    redrivable: bool  # has a subject that can be put back at all
    circuit_closed: bool = True


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    policy: str
    why: str
    hint: Mapping[str, str] = field(default_factory=dict)


NO_POLICY = "(none)"


def first_match(policies: Sequence[Policy], view: LetterView) -> Policy | None:
    return next((p for p in policies if p.matches(view.kind, view.codes)), None)


def decide(policies: Sequence[Policy], view: LetterView, now_ms: int) -> Decision:
    policy = first_match(policies, view)
    if policy is None:
        return Decision(Verdict.HOLD, NO_POLICY, "no policy matches: held for a person")
    verdict, why = _verdict(policy, view, now_ms)
    return Decision(verdict, policy.name, why, policy.hint if verdict is Verdict.REDRIVE else {})


def _verdict(policy: Policy, view: LetterView, now_ms: int) -> tuple[Verdict, str]:
    if policy.action is Action.HOLD:
        return Verdict.HOLD, "policy holds it for a person"
    if not view.redrivable:
        return Verdict.HOLD, "nothing to redrive (no job or message)"
    if view.redrives >= policy.budget:
        spent = f"redrive budget spent ({view.redrives} of {policy.budget})"
        return Verdict.EXHAUSTED, f"{spent}: held for a person"
    due_ms = view.at_ms + policy.delay_ms
    if now_ms < due_ms:
        return Verdict.WAIT, f"delay: due in {(due_ms - now_ms) / 1000:.0f} s"
    if policy.require is Requirement.CIRCUIT_CLOSED and not view.circuit_closed:
        return Verdict.WAIT, "its endpoint's circuit is not closed"
    return Verdict.REDRIVE, f"redrive {view.redrives + 1} of {policy.budget}"


def default_policies() -> tuple[Policy, ...]:
    """The policies without a file: out-of-memory jobs come back later with a smaller batch;
    jobs whose hosted model's vendor stayed unavailable come back once its circuit closed;
    webhook messages come back once their endpoint is healthy; everything else waits for a
    person (max_deliveries_exceeded is a poison job until someone looks)."""
    return (
        Policy(
            "gpu-oom-smaller-batch",
            DeadLetterKind.JOBS,
            frozenset({"CUDA_OUT_OF_MEMORY"}),
            Action.REDRIVE,
            delay_ms=300_000,
            budget=2,
            hint={"batch_max_size": "1"},
        ),
        Policy(
            "webhooks-after-recovery",
            DeadLetterKind.WEBHOOKS,
            frozenset({"exhausted", "endpoint_disabled"}),
            Action.REDRIVE,
            delay_ms=600_000,
            budget=3,
            require=Requirement.CIRCUIT_CLOSED,
        ),
        Policy(
            "upstream-after-recovery",
            DeadLetterKind.JOBS,
            frozenset({"UPSTREAM_UNAVAILABLE"}),
            Action.REDRIVE,
            delay_ms=300_000,
            budget=3,
            require=Requirement.CIRCUIT_CLOSED,
        ),
        Policy("jobs-held", DeadLetterKind.JOBS, frozenset({ANY_CODE}), Action.HOLD),
        Policy("webhooks-held", DeadLetterKind.WEBHOOKS, frozenset({ANY_CODE}), Action.HOLD),
    )
