"""Blocking work per class on a shared CPU: synthesis threads run at a lower OS priority.

Interactive and synthesis jobs already have their own streams and reserved slots (and on a
GPU, their own device turns and CUDA stream priorities); on the CPU -- decoding, encoding,
rendering, a CPU-only forward pass -- they would still share the cores evenly, so a flood of
full jobs would slow every preview down in proportion. Here a job's blocking work runs in a
thread of its class's pool, and the synthesis pool's threads lower their own scheduling
priority (Linux: `setpriority` on the thread id, a nice value; anything a thread starts, such
as a torch intra-op team, inherits it). The kernel then runs interactive work first whenever
both want a core, and gives synthesis work every core nobody else wants: no starvation, no
idle cores. Lowering one's own priority needs no privilege.

The pools' threads are long-lived (a fixed set per class, none started per job), and every
call they run goes through a `MemoryTrimmer` (memory.py), so the memory a job's work freed
goes back to the OS instead of staying parked in the thread's malloc arena.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, ParamSpec, TypeVar

import structlog

from splatq.shared.engine.keys import StreamName
from splatq.shared.engine.memory import PROCESS_TRIMMER, MemoryTrimmer

log = structlog.get_logger("splatq.cpu_priority")
P = ParamSpec("P")
T = TypeVar("T")


def lower_this_thread(nice: int) -> bool:
    """Lower the calling thread's priority by `nice` (Linux only); True when it took."""
    if nice <= 0 or not sys.platform.startswith("linux"):
        return False
    try:
        tid = threading.get_native_id()
        current = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(19, current + nice))
    except OSError as exc:
        log.warning("cpu_priority.not_lowered", error=str(exc))
        return False
    return True


# Called once in each pool thread with its class (a handler's per-thread setup: e.g. torch's
# intra-op thread count, which is per thread).
ThreadSetup = Callable[[StreamName], None]


def _start_thread(stream: StreamName, nice: int, setup: ThreadSetup | None) -> None:
    if stream is StreamName.SYNTHESIS:
        lower_this_thread(nice)
    if setup is not None:
        setup(stream)


class TrimmingThreadPool(ThreadPoolExecutor):
    """A thread pool whose every call runs through a `MemoryTrimmer`."""

    def __init__(self, trimmer: MemoryTrimmer, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.trimmer = trimmer

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        trimmer = self.trimmer

        def call() -> T:
            return trimmer.run(fn, *args, **kwargs)

        return super().submit(call)


class ClassExecutors:
    """A thread pool per class; the synthesis pool's threads run `synthesis_nice` lower."""

    def __init__(
        self,
        synthesis_nice: int,
        max_workers: int,
        name: str = "splatq",
        setup: ThreadSetup | None = None,
        trimmer: MemoryTrimmer = PROCESS_TRIMMER,
    ) -> None:
        self.synthesis_nice = synthesis_nice
        self._pools = {
            s: TrimmingThreadPool(
                trimmer,
                max_workers,
                f"{name}-{s.value}",
                initializer=_start_thread,
                initargs=(s, synthesis_nice, setup),
            )
            for s in StreamName
        }

    def for_stream(self, stream: StreamName) -> ThreadPoolExecutor:
        return self._pools[stream]

    def shutdown(self) -> None:
        for pool in self._pools.values():
            pool.shutdown(wait=False, cancel_futures=True)
