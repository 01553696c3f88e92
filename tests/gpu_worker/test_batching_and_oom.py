"""Dynamic batching decisions, the batcher loop, and OOM splitting (no model needed)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
import torch

from splatq.services.gpu_worker.batching import DynamicBatcher, batch_ready, take_batch
from splatq.services.gpu_worker.oom import DeviceOutOfMemory, MemoryBudget, forward_with_oom_split
from splatq.shared.errors import classify


def test_batch_leaves_when_full_or_when_the_oldest_waited_long_enough() -> None:
    """Triton semantics: full batch, or max wait measured from the oldest item."""
    assert not batch_ready(0, 0, 10.0, 8, 0.02, 0)
    assert not batch_ready(3, 3, 0.01, 8, 0.02, 0)
    assert batch_ready(8, 8, 0.0, 8, 0.02, 0)
    assert batch_ready(3, 3, 0.02, 8, 0.02, 0)
    assert batch_ready(3, 3 * 512 * 512, 0.0, 8, 0.02, 512 * 512)


def test_take_batch_respects_size_and_cost() -> None:
    """At most max_size items, within the cost bound; an oversized first item goes alone."""
    assert take_batch([1] * 20, 8, 0) == 8
    assert take_batch([4, 4, 4], 8, 8) == 2
    assert take_batch([100, 1, 1], 8, 8) == 1
    assert take_batch([1, 1], 8, 8) == 2


async def test_batcher_groups_concurrent_submissions_into_few_passes() -> None:
    """20 items submitted together with max 8 run in 3 passes, each item gets its own result."""
    passes: list[int] = []

    async def run(items: list[int]) -> list[int | BaseException]:
        passes.append(len(items))
        await asyncio.sleep(0.01)
        return [i * 10 for i in items]

    b: DynamicBatcher[int, int] = DynamicBatcher(run, max_size=8, max_wait_s=0.05)
    b.start()
    try:
        results = await asyncio.gather(*(b.submit(i) for i in range(20)))
    finally:
        await b.stop()
    assert results == [i * 10 for i in range(20)]
    assert passes == [8, 8, 4]


async def test_a_lone_item_waits_at_most_max_wait() -> None:
    """A single submission is dispatched after max_wait, not held for company."""

    async def run(items: list[str]) -> list[str | BaseException]:
        return items

    b: DynamicBatcher[str, str] = DynamicBatcher(run, max_size=8, max_wait_s=0.05)
    b.start()
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    try:
        assert await b.submit("x") == "x"
    finally:
        await b.stop()
    assert 0.04 <= loop.time() - t0 < 1.0


async def test_per_item_errors_reach_only_their_submitter() -> None:
    """An exception returned for one item fails that submission; its batch-mates succeed."""

    async def run(items: list[int]) -> list[int | BaseException]:
        return [ValueError("bad") if i == 2 else i for i in items]

    b: DynamicBatcher[int, int] = DynamicBatcher(run, max_size=4, max_wait_s=0.01)
    b.start()
    try:
        results = await asyncio.gather(*(b.submit(i) for i in range(4)), return_exceptions=True)
    finally:
        await b.stop()
    assert results[:2] == [0, 1]
    assert results[3] == 3
    assert isinstance(results[2], ValueError)


def _images(foreground: Sequence[int], size: int = 16) -> list[torch.Tensor]:
    out = []
    for n in foreground:
        img = torch.zeros(4, size, size)
        img[3].view(-1)[:n] = 1.0
        out.append(img)
    return out


def test_oom_splits_in_halves_and_a_job_too_big_alone_fails_alone() -> None:
    """Budget 100 fg px: [40, 40, 40, 200] -> OOM, split, ... -> three results and one
    non-retryable CUDA_OUT_OF_MEMORY, raised as the real torch.cuda.OutOfMemoryError."""
    budget = MemoryBudget(100)
    calls: list[int] = []
    released: list[bool] = []

    def forward(batch: Sequence[torch.Tensor]) -> list[int]:
        calls.append(len(batch))
        budget.check(torch.stack(list(batch)))
        return [int(b[3].sum()) for b in batch]

    out = forward_with_oom_split(
        forward, _images([40, 40, 40, 200]), release=lambda: released.append(True)
    )
    assert out[:3] == [40, 40, 40]
    assert isinstance(out[3], DeviceOutOfMemory)
    info = classify(out[3])
    assert (info.code, info.retryable) == ("CUDA_OUT_OF_MEMORY", False)
    assert calls == [4, 2, 2, 1, 1]
    assert len(released) == 3


def test_memory_budget_raises_the_real_cuda_oom_type() -> None:
    with pytest.raises(torch.cuda.OutOfMemoryError):
        MemoryBudget(10).check(torch.stack(_images([11])))
    MemoryBudget(0).check(torch.stack(_images([10_000 % 256])))  # 0 = off


def test_take_batch_respects_an_items_batch_cap() -> None:
    """An item capped at 1 (a job redriven with batch_max_size=1) runs alone: a batch stops
    before it, and a batch it heads holds only it; a cap of 2 allows one batch-mate."""
    assert take_batch([1] * 6, 8, 0, [0, 0, 1, 0, 0, 0]) == 2
    assert take_batch([1] * 6, 8, 0, [1, 0, 0, 0, 0, 0]) == 1
    assert take_batch([1] * 6, 8, 0, [0, 2, 0, 0, 0, 0]) == 2
    assert take_batch([1] * 6, 8, 0, [0] * 6) == 6


async def test_batcher_runs_a_capped_item_alone_and_at_once() -> None:
    """Four items submitted together, the third capped at 1: it gets a pass of its own, the
    others still share; a capped item at the head leaves without waiting for company."""
    passes: list[list[int]] = []

    async def run(items: list[int]) -> list[int | BaseException]:
        passes.append(items)
        return items

    b: DynamicBatcher[int, int] = DynamicBatcher(run, max_size=8, max_wait_s=0.2)
    b.start()
    try:
        caps = [0, 0, 1, 0]
        await asyncio.gather(*(b.submit(i, max_batch=c) for i, c in enumerate(caps)))
        assert [2] in passes
        assert all(len(p) == 1 for p in passes if 2 in p)
        assert sorted(i for p in passes for i in p) == [0, 1, 2, 3]
    finally:
        await b.stop()
    patient: DynamicBatcher[int, int] = DynamicBatcher(run, max_size=8, max_wait_s=3600)
    patient.start()
    try:  # an hour's max wait: only the cap lets it leave at once
        assert await asyncio.wait_for(patient.submit(9, max_batch=1), 60) == 9
    finally:
        await patient.stop()
