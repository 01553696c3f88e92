"""Device priority: one forward pass on the device at a time, and a waiting interactive pass
always goes before the next synthesis pass.

Without it the preview and full batchers each start their forward pass as soon as their
batch is ready, and an interactive batch that arrives while a large synthesis batch runs
waits for all of it (on CUDA the kernels interleave at best; on CPU the passes split the
cores). With it, a synthesis batch runs in chunks sized so that one chunk takes about
`max_pass_s`: an interactive batch waits at most one chunk, whatever the synthesis batch
size. Pure asyncio; the forward passes themselves run in threads, outside this module.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from enum import IntEnum


class Priority(IntEnum):
    """Lower runs first."""

    INTERACTIVE = 0
    SYNTHESIS = 1


@dataclass
class DeviceScheduler:
    """A priority lock over the device: `async with scheduler.turn(priority): <one pass>`."""

    _busy: bool = False
    _waiters: dict[Priority, deque[asyncio.Future[None]]] = field(
        default_factory=lambda: {p: deque() for p in Priority}
    )
    turns: dict[Priority, int] = field(default_factory=lambda: dict.fromkeys(Priority, 0))

    def waiting(self, priority: Priority) -> int:
        return sum(1 for f in self._waiters[priority] if not f.done())

    @contextlib.asynccontextmanager
    async def turn(self, priority: Priority) -> AsyncIterator[None]:
        await self._acquire(priority)
        try:
            yield
        finally:
            self._release()

    async def _acquire(self, priority: Priority) -> None:
        if not self._busy:
            self._busy = True
            self.turns[priority] += 1
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[priority].append(future)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self._release()  # handed the device just as we were cancelled: pass it on
            raise
        self.turns[priority] += 1

    def _release(self) -> None:
        for p in Priority:
            queue = self._waiters[p]
            while queue:
                future = queue.popleft()
                if not future.done():
                    future.set_result(None)  # the device goes straight to the next holder
                    return
        self._busy = False


@dataclass
class ChunkSizer:
    """How many synthesis items one device turn may hold: as many as fit in `max_pass_s` by
    the per-item time measured so far (an exponentially weighted mean), at least one, at
    most `max_items`; one until a first pass was measured (an unmeasured turn must not hold
    the device for a whole batch). 0 s = never split."""

    max_pass_s: float
    max_items: int
    per_item_s: float | None = None
    alpha: float = 0.3

    def size(self) -> int:
        if self.max_pass_s <= 0:
            return self.max_items
        if self.per_item_s is None or self.per_item_s <= 0:
            return 1
        return max(1, min(self.max_items, int(self.max_pass_s / self.per_item_s)))

    def observe(self, items: int, seconds: float) -> None:
        if items <= 0 or seconds <= 0:
            return
        sample = seconds / items
        if self.per_item_s is None:
            self.per_item_s = sample
        else:
            self.per_item_s = self.alpha * sample + (1 - self.alpha) * self.per_item_s
