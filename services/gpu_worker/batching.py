"""Dynamic batching: jobs of one quality wait together until the batch is full, its oldest job
has waited `max_wait`, or the next job would exceed the pixel budget; then one forward pass.

The decision is a pure function (`batch_ready`); the batcher is a small asyncio loop that never
blocks: the forward pass itself runs in the caller-supplied coroutine (off the event loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


def batch_ready(
    count: int,
    cost: int,
    waited_s: float,
    max_size: int,
    max_wait_s: float,
    max_cost: int,
) -> bool:
    """True when a batch should be dispatched now (Triton's rule, with a cost bound)."""
    if count == 0:
        return False
    if count >= max_size or waited_s >= max_wait_s:
        return True
    return bool(max_cost) and cost >= max_cost


def take_batch(
    costs: Sequence[int], max_size: int, max_cost: int, limits: Sequence[int] = ()
) -> int:
    """How many queued items (oldest first) form the next batch: at most `max_size`, and
    within `max_cost` total unless the first item alone exceeds it (it then goes alone).
    `limits[i]` > 0 caps the size of any batch item i is in (a job redriven with a smaller
    batch hint): the batch stops before an item whose cap it would exceed."""
    total, bound = 0, max_size
    for i, c in enumerate(costs[:max_size]):
        limit = limits[i] if i < len(limits) and limits[i] > 0 else max_size
        if i > 0 and ((max_cost and total + c > max_cost) or i + 1 > min(bound, limit)):
            return i
        bound = min(bound, limit)
        total += c
    return min(len(costs), max_size)


@dataclass
class _Pending(Generic[T, R]):
    item: T
    cost: int
    arrived: float
    future: asyncio.Future[R]
    max_batch: int = 0  # > 0: the largest batch this item may run in


@dataclass
class DynamicBatcher(Generic[T, R]):
    """One queue of same-shaped items (e.g. one quality); `run_batch` gets a list of items and
    returns one result or exception per item, in order."""

    run_batch: Callable[[list[T]], Awaitable[list[R | BaseException]]]
    max_size: int
    max_wait_s: float
    max_cost: int = 0
    _queue: list[_Pending[T, R]] = field(default_factory=list)
    _wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="batcher")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for p in self._queue:
            if not p.future.done():
                p.future.cancel()
        self._queue.clear()

    @property
    def waiting(self) -> int:
        return len(self._queue)

    async def submit(self, item: T, cost: int = 1, max_batch: int = 0) -> R:
        """Queue one item and wait for its result (or its exception); `max_batch` > 0 caps
        the size of the batch it runs in."""
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._queue.append(_Pending(item, cost, time.monotonic(), future, max_batch))
        self._wakeup.set()
        try:
            return await future
        except asyncio.CancelledError:
            # A canceled job leaves the queue if it has not been batched yet.
            self._queue[:] = [p for p in self._queue if p.future is not future]
            raise

    async def _loop(self) -> None:
        while True:
            if not self._queue:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            head = self._queue[0]
            waited = time.monotonic() - head.arrived
            cost = sum(p.cost for p in self._queue[: self.max_size])
            size = min(self.max_size, head.max_batch or self.max_size)
            if not batch_ready(
                len(self._queue), cost, waited, size, self.max_wait_s, self.max_cost
            ):
                self._wakeup.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wakeup.wait(), self.max_wait_s - waited)
                continue
            n = take_batch(
                [p.cost for p in self._queue],
                self.max_size,
                self.max_cost,
                [p.max_batch for p in self._queue],
            )
            batch, self._queue[:] = self._queue[:n], self._queue[n:]
            live = [p for p in batch if not p.future.done()]
            if not live:
                continue
            try:
                results = await self.run_batch([p.item for p in live])
            except Exception as exc:
                results = [exc] * len(live)
            for p, r in zip(live, results, strict=True):
                if p.future.done():
                    continue
                if isinstance(r, BaseException):
                    p.future.set_exception(r)
                else:
                    p.future.set_result(r)
