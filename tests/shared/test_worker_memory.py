"""A worker's job threads give the memory their calls freed back (shared/engine/memory.py):
the trimmer's policy (pure), and in fresh processes what glibc then does -- a pool's freed
memory goes back to the OS once it is idle, and a worker process uses at most
`malloc_arena_max` malloc arenas."""

from __future__ import annotations

import functools
import subprocess
import sys
import threading

import pytest

from splatq.shared.engine.memory import MemoryTrimmer, _glibc
from splatq.shared.settings import Settings
from tests.helpers import REPO_ROOT

glibc_only = pytest.mark.skipif(_glibc() is None, reason="needs glibc malloc")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_trimmer_trims_when_the_last_call_in_flight_returns() -> None:
    released: list[int] = []
    trimmer = MemoryTrimmer(60.0, release=lambda: released.append(1), clock=Clock())
    assert trimmer.run(lambda x: x * 2, 21) == 42
    assert trimmer.run(lambda: "again") == "again"
    assert len(released) == 2  # idle after each: trimmed each time, whatever the interval
    with pytest.raises(ValueError, match="boom"):
        trimmer.run(lambda: (_ for _ in ()).throw(ValueError("boom")))
    assert len(released) == 3  # a call that raised freed its memory too


def test_while_calls_overlap_the_trimmer_trims_at_most_once_per_interval() -> None:
    released: list[int] = []
    clock = Clock()
    trimmer = MemoryTrimmer(1.0, release=lambda: released.append(1), clock=clock)
    go_on = threading.Event()
    started = threading.Event()

    def long_call() -> None:
        started.set()
        go_on.wait(10)

    outer = threading.Thread(target=trimmer.run, args=(long_call,))
    outer.start()
    started.wait(10)
    clock.now += 0.5
    trimmer.run(lambda: None)  # another call is in flight, and the interval has not passed
    assert released == []
    clock.now += 0.6
    trimmer.run(lambda: None)  # still overlapping, but a second since the last trim
    assert len(released) == 1
    trimmer.run(lambda: None)
    assert len(released) == 1
    go_on.set()
    outer.join(10)
    assert len(released) == 2  # the last call in flight returned: idle, trimmed


def test_a_disabled_trimmer_never_trims() -> None:
    released: list[int] = []
    trimmer = MemoryTrimmer(0.0, release=lambda: released.append(1))
    trimmer.enabled = False
    trimmer.run(lambda: None)
    assert released == []


# In a fresh process: 8 pool threads at once each allocate ~60 MB in 1-4 MB tensors (what a
# job's torch work does) and keep one small tensor past the call (as a job's results, logs,
# caches do), which pins the top of its thread's arena. Prints the RSS the calls left behind
# once the pool is idle, and the malloc arenas in use (malloc_info's <heap> count).
PROBE = """
import ctypes, os, sys, tempfile, threading, torch
from splatq.shared.engine.cpu_priority import ClassExecutors
from splatq.shared.engine.keys import StreamName
from splatq.shared.engine.memory import configure_worker_memory

configure_worker_memory(int(sys.argv[1]), sys.argv[2] == "1", 1.0)
pool = ClassExecutors(0, 8).for_stream(StreamName.INTERACTIVE)
together = threading.Barrier(8)

def rss():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

def job(i, size):
    together.wait(30)
    big = [torch.ones(size * (1 + (i + k) % 4), dtype=torch.uint8) for k in range(24)]
    kept = torch.ones(256)
    del big
    return kept

def round_of(size):
    return [f.result() for f in [pool.submit(job, i, size) for i in range(8)]]

kept = round_of(1024)  # warm: the 8 threads, torch, their arenas
before = rss()
for _ in range(2):
    kept += round_of(2**20)
after = rss()
libc = ctypes.CDLL("libc.so.6")
libc.fopen.restype = ctypes.c_void_p
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]
path = tempfile.mktemp()
fp = libc.fopen(path.encode(), b"w")
libc.malloc_info(0, fp)
libc.fclose(fp)
heaps = open(path).read().count("<heap nr=")
os.unlink(path)
print(round(after - before), heaps)
"""


@functools.cache
def probe(arena_max: int, trim: bool) -> tuple[int, int]:
    """(MB the calls left resident once the pool was idle, malloc arenas in use)."""
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(arena_max), "1" if trim else "0"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    retained, heaps = out.stdout.splitlines()[-1].split()
    return int(retained), int(heaps)


@glibc_only
def test_a_pool_hands_the_memory_its_calls_freed_back_once_idle() -> None:
    retained, _ = probe(Settings().malloc_arena_max, trim=True)
    kept, _ = probe(0, trim=False)
    assert kept > 100, f"the probe should show glibc keeping freed memory: {kept} MB"
    assert retained < 25, f"{retained} MB stayed resident (untrimmed: {kept} MB)"


@glibc_only
def test_a_worker_process_uses_at_most_malloc_arena_max_arenas() -> None:
    _, capped = probe(2, trim=True)
    _, uncapped = probe(0, trim=True)
    assert uncapped > 2  # glibc's default: an arena per thread, up to 8 per core
    assert capped <= 2


def test_malloc_arena_max_defaults_to_2_and_an_operators_malloc_arena_max_stands() -> None:
    assert Settings.from_env({}).malloc_arena_max == 2
    assert Settings.from_env({"SPLATQ_MALLOC_ARENA_MAX": "4"}).malloc_arena_max == 4
    # glibc reads MALLOC_ARENA_MAX itself at start: the worker then leaves the arenas alone
    env = {"MALLOC_ARENA_MAX": "8", "SPLATQ_MALLOC_ARENA_MAX": "4"}
    assert Settings.from_env(env).malloc_arena_max == 0
    s = Settings.from_env({"SPLATQ_MEMORY_TRIM": "0", "SPLATQ_MEMORY_TRIM_INTERVAL_MS": "250"})
    assert (s.memory_trim, s.memory_trim_interval_ms) == (False, 250)
    assert Settings().memory_trim
