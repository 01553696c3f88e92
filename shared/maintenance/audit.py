"""Audit records of dead-letter actions: what was done, why, by which policy or person (pure).
They are written by the same script as the action (redrive.lua, wh_redrive.lua, dlq_note.lua)
to the audit trail of the entry's subject, and `splatq dlq show` prints them."""

from __future__ import annotations

import getpass
from dataclasses import dataclass
from enum import StrEnum

import orjson

AUDIT_TTL_MS = 30 * 24 * 3600 * 1000


class AuditAction(StrEnum):
    REDRIVEN = "redriven"
    HELD = "held"
    EXHAUSTED = "exhausted"  # held: its redrive budget is spent
    PURGED = "purged"


@dataclass(frozen=True, slots=True)
class AuditRecord:
    action: AuditAction
    why: str
    kind: str
    # "policy:<name>" for the redriver, "person:<user>" for the CLI.
    actor: str
    codes: str = ""

    def encoded(self) -> str:
        """The JSON array of field, value pairs the scripts append."""
        pairs = ["action", self.action.value, "why", self.why[:300], "kind", self.kind,
                 "actor", self.actor, "codes", self.codes]  # fmt: skip
        return orjson.dumps(pairs).decode()


def policy_actor(policy: str, holder: str) -> str:
    return f"policy:{policy} ({holder})"


def person_actor(name: str = "") -> str:
    """Who runs the CLI: `--as NAME` when given (a shared bastion account), else the login."""
    if not name:
        try:
            name = getpass.getuser()
        except (OSError, KeyError):
            name = "unknown"
    return f"person:{name}"
