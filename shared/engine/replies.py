"""The words the engine's job scripts (shared/engine/lua/) answer with, and the one map from a
run's reply to the exception it raises.

Scripts answer `{'<word>', ...}` (or a bare word); Python compares against these members --
a `StrEnum`, so a member equals the word Redis sent -- and a test holds every word the Lua
returns to this list, so a misspelt reply fails the suite instead of a branch in production.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

from splatq.shared.errors import LeaseLost


class Reply(StrEnum):
    # commits and fenced writes of a run (finish, advance, announce, meter, note, progress)
    OK = "ok"
    ALREADY = "already"
    LEASE_LOST = "lease_lost"
    ILLEGAL = "illegal"
    CANCEL_REQUESTED = "cancel_requested"
    # enqueue
    CREATED = "created"
    DUPLICATE = "duplicate"
    NOT_JOINED = "not_joined"
    EXISTS = "exists"
    OVERLOADED = "overloaded"
    # take / start: what became of each delivered entry
    STARTED = "started"
    RAW = "raw"
    SKIP = "skip"
    STALE = "stale"
    BUSY = "busy"
    HELD = "held"
    DRAINED = "drained"
    UNKNOWN = "unknown"
    DEAD_LETTERED = "dead_lettered"
    # reclaim (the reaper), promote, redrive, cancel
    TAKE = "take"
    OUTAGE_GRACE = "outage_grace"
    ALIVE = "alive"
    GONE = "gone"
    PROMOTED = "promoted"
    NOT_DUE = "not_due"
    REDRIVEN = "redriven"
    NOT_REDRIVABLE = "not_redrivable"
    NOT_FOUND = "not_found"
    ALREADY_FINISHED = "already_finished"
    CANCELED = "canceled"
    BAD_FIELD = "bad_field"
    # finish_batch.lua: one job's finish raised (its batch-mates were committed)
    ERROR = "error"


# A run's reply that ends the run, and what it raises (JobContext's fenced writes).
RUN_ERRORS: Mapping[Reply, type[Exception]] = {Reply.LEASE_LOST: LeaseLost}


def run_reply(job_id: str, outcome: str) -> Reply:
    """`outcome` as a Reply; raises the run's exception for a reply that ends the run (the
    run's job was taken over) and ValueError for a word no script answers."""
    reply = Reply(outcome)
    error = RUN_ERRORS.get(reply)
    if error is not None:
        raise error(job_id)
    return reply
