"""Device priority: one pass on the device at a time, interactive before synthesis, and
synthesis batches cut into chunks so an interactive batch waits at most one chunk."""

from __future__ import annotations

import asyncio
import time

import torch

from splatq.services.gpu_worker.device_scheduler import ChunkSizer, DeviceScheduler, Priority
from splatq.services.gpu_worker.handler import GpuJobHandler, _Item
from splatq.shared.settings import Settings
from splatq.shared.testing import eventually
from tests.helpers import GpuHandlerFactory


async def test_a_waiting_interactive_turn_goes_before_waiting_synthesis_turns() -> None:
    scheduler = DeviceScheduler()
    order: list[str] = []
    holding = asyncio.Event()
    release = asyncio.Event()

    async def use(name: str, priority: Priority, hold: asyncio.Event | None = None) -> None:
        async with scheduler.turn(priority):
            order.append(name)
            if hold is not None:
                holding.set()
                await hold.wait()

    first = asyncio.create_task(use("s1", Priority.SYNTHESIS, release))
    await holding.wait()
    waiting = [asyncio.create_task(use("s2", Priority.SYNTHESIS))]
    await asyncio.sleep(0)
    waiting.append(asyncio.create_task(use("s3", Priority.SYNTHESIS)))
    await asyncio.sleep(0)
    waiting.append(asyncio.create_task(use("i1", Priority.INTERACTIVE)))
    await asyncio.sleep(0)
    assert scheduler.waiting(Priority.SYNTHESIS) == 2
    assert scheduler.waiting(Priority.INTERACTIVE) == 1
    release.set()
    await asyncio.gather(first, *waiting)
    assert order == ["s1", "i1", "s2", "s3"]


async def test_a_cancelled_waiter_does_not_keep_the_device() -> None:
    scheduler = DeviceScheduler()
    held = asyncio.Event()
    release = asyncio.Event()

    async def hold() -> None:
        async with scheduler.turn(Priority.SYNTHESIS):
            held.set()
            await release.wait()

    holder = asyncio.create_task(hold())
    await held.wait()

    async def wait_turn() -> None:
        async with scheduler.turn(Priority.INTERACTIVE):
            pass

    doomed = asyncio.create_task(wait_turn())
    await asyncio.sleep(0)
    doomed.cancel()
    release.set()
    await holder
    # the device is free again: a new turn is granted at once
    await asyncio.wait_for(wait_turn(), timeout=1)


def test_chunks_are_sized_by_the_measured_time_per_item() -> None:
    sizer = ChunkSizer(max_pass_s=0.25, max_items=8)
    assert sizer.size() == 1  # nothing measured yet: one item, so the first turn is short too
    sizer.observe(8, 0.8)  # 100 ms per item
    assert sizer.size() == 2
    sizer.observe(1, 1.0)  # slower: the mean moves, and the chunk never drops below one
    assert sizer.size() == 1
    assert ChunkSizer(max_pass_s=0, max_items=8, per_item_s=1.0).size() == 8


class _SlowModel:
    """The builtin model, plus a fixed time per item in the batch (a slow device)."""

    def __init__(self, inner: object, per_item_s: float) -> None:
        self._inner = inner
        self.per_item_s = per_item_s

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    def infer(self, images: torch.Tensor) -> object:
        time.sleep(self.per_item_s * images.shape[0])
        return self._inner.infer(images)  # type: ignore[attr-defined]


async def test_a_preview_batch_runs_after_one_synthesis_chunk_not_the_whole_batch(
    gpu_handler_factory: GpuHandlerFactory, settings: Settings
) -> None:
    """A full batch of 8 (40 ms per item, chunks of about 100 ms) is on the device when a
    preview job arrives: the preview pass runs after the current chunk, and the rest of the
    full batch after it."""
    handler: GpuJobHandler = await gpu_handler_factory(
        settings.with_overrides(batch_max_size=8, batch_max_wait_ms=5, device_max_pass_ms=100)
    )
    handler.model = _SlowModel(handler.model, 0.04)  # type: ignore[assignment]
    handler.synthesis_chunks.observe(1, 0.04)  # as measured by an earlier pass

    def item(quality: str) -> _Item:
        # preview-sized images in both batchers: the model takes any size, and the test is
        # about the order of passes, not their content
        res = handler.model.input_resolution("preview")
        image = torch.zeros(4, res, res)
        image[:, res // 4 : 3 * res // 4, res // 4 : 3 * res // 4] = 1.0
        return _Item(image, quality, time.monotonic())

    full = [asyncio.create_task(handler.batchers["full"].submit(item("full"))) for _ in range(8)]

    async def first_chunk_running() -> bool:
        return bool(handler.pass_log)

    await eventually(first_chunk_running, timeout=10, interval=0.005)
    preview = await asyncio.wait_for(handler.batchers["preview"].submit(item("preview")), 10)
    await asyncio.gather(*full)
    assert preview.count > 0
    log = list(handler.pass_log)
    assert log[0] == ("full", 2)
    assert log[1] == ("preview", 1), log
    assert sum(n for q, n in log if q == "full") == 8
    assert all(n <= 2 for q, n in log if q == "full"), log
    assert handler.device_scheduler.turns[Priority.SYNTHESIS] >= 4
