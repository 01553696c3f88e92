"""The job state machine, written down once: statuses and the transitions allowed between them.

Pure data. Lua scripts receive this table (see `splatq.shared.engine.scripts`) and refuse
anything not in it.
"""

from __future__ import annotations

from enum import StrEnum


class JobStatus(StrEnum):
    QUEUED = "queued"
    PROCESSING = "processing"
    RETRYING = "retrying"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELED = "canceled"


TERMINAL: frozenset[JobStatus] = frozenset(
    {JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELED}
)

# from -> allowed targets. Why each edge exists:
#   queued -> processing      a worker started it (lease taken)
#   processing -> completed   artifacts committed
#   processing -> failed      permanent error, attempts exhausted, or dead-lettered
#   queued/retrying -> failed dead-lettered by the reaper before a worker could finish it
#   processing -> retrying    transient error; parked in the delayed set with backoff
#   processing -> queued      released without burning an attempt (SIGTERM drain), or
#                             recovered by the reaper after the worker's lease lapsed
#   retrying -> processing    the delayed entry was promoted and a worker started it
#   * -> canceled             from any non-terminal state, on the user's request
#   failed -> queued          a dead-lettered job redriven by an operator
ALLOWED_TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    JobStatus.QUEUED: frozenset({JobStatus.PROCESSING, JobStatus.CANCELED, JobStatus.FAILED}),
    JobStatus.PROCESSING: frozenset(
        {
            JobStatus.COMPLETED,
            JobStatus.FAILED,
            JobStatus.RETRYING,
            JobStatus.QUEUED,
            JobStatus.CANCELED,
        }
    ),
    JobStatus.RETRYING: frozenset({JobStatus.PROCESSING, JobStatus.CANCELED, JobStatus.FAILED}),
    JobStatus.COMPLETED: frozenset(),
    JobStatus.FAILED: frozenset({JobStatus.QUEUED}),
    JobStatus.CANCELED: frozenset(),
}


def is_allowed(current: JobStatus, target: JobStatus) -> bool:
    """True when `current -> target` is an edge of the state machine."""
    return target in ALLOWED_TRANSITIONS[current]


def lua_transition_table() -> str:
    """The table as a Lua literal, `ALLOWED["queued"]["processing"] = true` style."""
    rows = []
    for source, targets in ALLOWED_TRANSITIONS.items():
        inner = ", ".join(f'["{t.value}"] = true' for t in sorted(targets))
        rows.append(f'["{source.value}"] = {{{inner}}}')
    return "local ALLOWED = {" + ", ".join(rows) + "}\n"
