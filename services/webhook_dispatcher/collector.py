"""The cyclic garbage collector of a process while a dispatcher runs in it, set for a steady
stream of short-lived attempts.

Measured on the webhook benchmark (bench/webhook_throughput.py), Python 3.11: at full speed
the collector cost ~25 µs per delivery, two things:
- full collections re-walked the ~65k objects of the set-up heap (modules, classes, clients)
  every few thousand attempts: frozen (`gc.freeze`), they are out of its reach -- they live
  as long as the process anyway;
- a young-generation collection every 700 net new container objects ran several times per
  batch of attempts (each attempt's futures, dicts and frames are alive when it runs):
  at 5000, nearly all of them are gone again before one runs, and cycles still are
  collected, a few thousand objects later.
Both are put back when the last dispatcher of the process stops (tests run several in one
process; the service runs one for its whole life)."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

YOUNG_THRESHOLD = 5000

_running = 0
_saved: tuple[int, int, int] = gc.get_threshold()


@contextlib.contextmanager
def tuned_collector() -> Iterator[None]:
    """While the block runs (nested: until the outermost one ends), the set-up heap frozen
    and the young generation's threshold raised to YOUNG_THRESHOLD."""
    global _running, _saved  # noqa: PLW0603 - one collector per process
    if _running == 0:
        _saved = gc.get_threshold()
        gc.freeze()
        gc.set_threshold(max(YOUNG_THRESHOLD, _saved[0]), _saved[1], _saved[2])
    _running += 1
    try:
        yield
    finally:
        _running -= 1
        if _running == 0:
            gc.set_threshold(*_saved)
            gc.unfreeze()
