"""Which job classes a worker process serves, and what serving synthesis alone means for its
OS priority (docs/architecture.md#per-class-worker-processes).

A process that serves both classes shares its cores, its GIL and (on a CPU device) its
"device" between them: threads of the synthesis class run niced (cpu_priority.py), but a
synthesis thread holding the GIL, or the device turn, still makes an interactive job wait. A
process that serves one class has none of that to share: a synthesis-only process lowers its
whole priority (every thread, its event loop included) at start -- niced, and with
`synthesis_idle` under SCHED_IDLE, the policy of work that runs only on cores nothing else
wants -- so the kernel runs every interactive process first on cores both want. Pure policy
plus two system calls per thread.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from pathlib import Path

import structlog

from splatq.shared.config.vocabulary import UP_LAYOUTS, parse_class_names
from splatq.shared.engine.keys import StreamName

log = structlog.get_logger("splatq.worker_classes")
__all__ = [
    "UP_LAYOUTS", "class_label", "lower_if_synthesis_only", "lower_this_process",
    "lowers_process", "parse_class_list",
]  # fmt: skip


def parse_class_list(raw: str | Iterable[str]) -> tuple[StreamName, ...]:
    """'interactive', 'synthesis', 'interactive,synthesis' or 'all' (also '' = all) → the
    classes in stream order; an unknown name raises ValueError."""
    return tuple(StreamName(name) for name in parse_class_names(raw))


def class_label(classes: Iterable[StreamName]) -> str:
    """'interactive' or 'synthesis' for a one-class process, '' for one serving both."""
    chosen = tuple(classes)
    return chosen[0].value if len(chosen) == 1 else ""


def lowers_process(classes: Iterable[StreamName], nice: int) -> bool:
    """Whether a process serving `classes` runs niced as a whole: synthesis alone, nice on."""
    return tuple(classes) == (StreamName.SYNTHESIS,) and nice > 0


def lower_this_process(nice: int, idle: bool = False) -> int:
    """Lower every thread of this process by `nice`, and with `idle` move it to SCHED_IDLE
    (Linux: priority and policy are per thread, and a new thread inherits its creator's, so
    the threads started later run lowered too); returns how many threads it lowered.
    Lowering needs no privilege; raising back would. Under SCHED_IDLE a thread has the
    smallest CFS weight (3, where nice 19 has 15) and any normal thread that wakes takes
    its core at once: with ten synthesis threads runnable beside a preview's on a core, the
    preview keeps ~97 % of it instead of ~87 % (nice 19 alone)."""
    if nice <= 0 or not sys.platform.startswith("linux"):
        return 0
    lowered = 0
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            tid = int(task.name)
            current = os.getpriority(os.PRIO_PROCESS, tid)
            os.setpriority(os.PRIO_PROCESS, tid, min(19, current + nice))
            if idle:
                os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
            lowered += 1
        except (ValueError, OSError) as exc:  # a thread that just ended
            log.debug("worker_classes.thread_not_lowered", task=task.name, error=str(exc))
    log.info("worker_classes.process_lowered", nice=nice, sched_idle=idle, threads=lowered)
    return lowered


def lower_if_synthesis_only(classes: Iterable[str], nice: int, idle: bool = False) -> int:
    """At a worker process's start, before it starts threads: lower the whole process when it
    serves synthesis alone (see `lowers_process`); returns the threads lowered."""
    if not lowers_process(parse_class_list(classes), nice):
        return 0
    return lower_this_process(nice, idle)
