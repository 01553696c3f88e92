"""A worker process gives the memory its jobs freed back to the OS (glibc malloc).

What kept a CPU worker's resident memory growing with the jobs it ran (issue #27,
docs/operations.md#memory): glibc keeps memory a thread frees in that thread's arena for
reuse, up to 8 arenas per core, and hands little of it back; a job's blocking work runs in a
fixed set of pool threads (cpu_priority.py), each of which kept about the peak of the largest
work it had run. The more threads that had ever run a big step at once, the more memory stayed
resident, and it never came back when the queue drained. Here:

- `limit_arenas`: at most `malloc_arena_max` arenas in the process (mallopt M_ARENA_MAX), set
  before its threads start, so freed memory is shared between threads instead of parked in one
  arena per thread;
- `MemoryTrimmer`: after a blocking call returns, `malloc_trim(0)` hands every arena's free
  pages back to the OS: always when no other call is in flight (the worker went idle), and at
  most once per interval while calls overlap (an overloaded worker), so the cost stays bounded.

Both are no-ops where the C library is not glibc (musl, macOS).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys
import threading
import time
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import structlog

log = structlog.get_logger("splatq.memory")

P = ParamSpec("P")
T = TypeVar("T")
M_ARENA_MAX = -8  # glibc's malloc.h


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        libc.malloc_trim.restype = ctypes.c_int
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.mallopt.restype = ctypes.c_int
    except (OSError, AttributeError):
        return None  # not glibc: no malloc_trim / mallopt
    return libc


def release_free_memory() -> bool:
    """`malloc_trim(0)`: every arena's free pages go back to the OS. True when some did."""
    libc = _glibc()
    return bool(libc.malloc_trim(0)) if libc is not None else False


def limit_arenas(n: int) -> bool:
    """At most `n` malloc arenas in this process (0: leave glibc's default). Takes effect
    only before the process has used more than 8 arenas: call it before starting threads."""
    libc = _glibc()
    if n <= 0 or libc is None:
        return False
    return bool(libc.mallopt(M_ARENA_MAX, n))


class MemoryTrimmer:
    """Wraps blocking calls: after one returns, free memory goes back to the OS when no
    other call is in flight, else at most once per `min_interval_s` (one thread at a time;
    a call that finds another thread trimming skips)."""

    def __init__(
        self,
        min_interval_s: float = 1.0,
        release: Callable[[], object] = release_free_memory,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.min_interval_s = min_interval_s
        self.enabled = True
        self.trims = 0
        self._release = release
        self._clock = clock
        self._lock = threading.Lock()
        self._trimming = threading.Lock()
        self._in_flight = 0
        self._last = clock()

    def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        with self._lock:
            self._in_flight += 1
        try:
            return fn(*args, **kwargs)
        finally:
            self._after()

    def _after(self) -> None:
        with self._lock:
            self._in_flight -= 1
            idle = self._in_flight == 0
        if not self.enabled:
            return
        if not idle and self._clock() - self._last < self.min_interval_s:
            return
        if not self._trimming.acquire(blocking=False):
            return  # another thread is handing the free memory back right now
        try:
            self._last = self._clock()
            self._release()
            self.trims += 1
        finally:
            self._trimming.release()


# The process's trimmer: every job thread pool (cpu_priority.ClassExecutors) runs its calls
# through it; `configure_worker_memory` sets it from the settings at worker start.
PROCESS_TRIMMER = MemoryTrimmer()


def configure_worker_memory(arena_max: int, trim: bool, trim_interval_s: float) -> None:
    """A worker process's allocator policy; call first, before torch starts threads."""
    limited = limit_arenas(arena_max)
    PROCESS_TRIMMER.enabled = trim and _glibc() is not None
    PROCESS_TRIMMER.min_interval_s = trim_interval_s
    log.debug(
        "memory.configured",
        arena_max=arena_max if limited else 0,
        trim=PROCESS_TRIMMER.enabled,
        trim_interval_s=trim_interval_s,
    )
