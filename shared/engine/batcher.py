"""Group commit for asyncio: everything handed over at the same moment goes out in one call.

`submit(item)` queues an item and returns a future of its own answer; one loop (`run`) takes
every item queued at that moment (up to `max_batch`) and calls `flush(items)`, which answers
each item in order -- a value, or an exception that its submitter's future raises. A `flush`
that raises answers every item of its batch with that exception. The worker's committer
(every finished job's commit script, one round trip) and the webhook dispatcher's recorder
(every finished delivery's record) are each one of these.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

DEFAULT_MAX_BATCH = 256


class Batcher(Generic[T, R]):
    def __init__(
        self,
        flush: Callable[[list[T]], Awaitable[Sequence[R | BaseException]]],
        max_batch: int = DEFAULT_MAX_BATCH,
    ) -> None:
        self._flush = flush
        self._max_batch = max_batch
        self._queue: asyncio.Queue[tuple[T, asyncio.Future[R]]] = asyncio.Queue()

    def submit(self, item: T) -> asyncio.Future[R]:
        """Queue `item`; the future is its answer once its batch has been flushed."""
        done: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((item, done))
        return done

    def queued(self) -> int:
        return self._queue.qsize()

    async def join(self) -> None:
        """Wait until every item submitted so far has been flushed and answered."""
        await self._queue.join()

    async def run(self) -> None:
        """The flushing loop, until cancelled (a batch being flushed finishes first only if
        the caller waits for `join` before cancelling)."""
        queue = self._queue
        while True:
            batch = [await queue.get()]
            while not queue.empty() and len(batch) < self._max_batch:
                batch.append(queue.get_nowait())
            try:
                await self._answer(batch)
            finally:
                for _ in batch:
                    queue.task_done()

    async def _answer(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        answers: Sequence[R | BaseException]
        try:
            answers = await self._flush([item for item, _ in batch])
        except Exception as exc:
            answers = [exc] * len(batch)
        for (_, done), answer in zip(batch, answers, strict=True):
            if done.done():
                continue
            if isinstance(answer, BaseException):
                done.set_exception(answer)
            else:
                done.set_result(answer)
