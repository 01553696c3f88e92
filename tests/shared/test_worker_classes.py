"""Per-class workers against a real Redis: a worker serving one class takes that class's jobs
only, whatever its idle slots, so a synthesis flood never holds an interactive process."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis

from splatq.shared.engine.job_context import JobContext
from splatq.shared.engine.jobs import JobOutcome
from splatq.shared.engine.keys import STREAMS, StreamName
from splatq.shared.engine.queue import JobQueue
from splatq.shared.engine.worker_classes import (
    class_label,
    lowers_process,
    parse_class_list,
)
from splatq.shared.settings import Settings, SettingsError
from splatq.shared.testing import WorkerFactory, eventually, wait_for_status
from tests.helpers import spec


class GatedHandler:
    """Records the jobs it ran; a full job waits for `gate` (it holds its slot until then)."""

    def __init__(self, gate: asyncio.Event) -> None:
        self.gate = gate
        self.ran: list[str] = []

    async def __call__(self, ctx: JobContext) -> JobOutcome:
        self.ran.append(ctx.job.id)
        if ctx.job.quality == "full":
            await self.gate.wait()
        return JobOutcome(artifacts={"result": f"mem://{ctx.job.id}"}, model="test-model")


async def _statuses(queue: JobQueue, job_ids: list[str]) -> list[str]:
    jobs = [await queue.get(j) for j in job_ids]
    return [j.status.value if j is not None else "missing" for j in jobs]


async def test_per_class_workers_each_take_their_own_class_only(
    queue: JobQueue, start_worker: WorkerFactory
) -> None:
    """Full jobs hold every slot of a synthesis-only worker; a preview meanwhile starts and
    completes in the interactive-only worker, which takes none of the waiting full jobs
    though three of its slots idle; with the interactive worker gone, the synthesis worker,
    its slots idle again, runs the rest of the flood and a later full job and leaves a
    preview waiting for its own class's process (a shared pool would have borrowed both)."""
    gate = asyncio.Event()
    on_interactive, on_synthesis = GatedHandler(gate), GatedHandler(gate)
    interactive = await start_worker(on_interactive, worker_classes=("interactive",))
    await start_worker(on_synthesis, worker_classes=("synthesis",), worker_concurrency=2)
    flood = [(await queue.enqueue(spec("full"))).job_id for _ in range(4)]

    async def synthesis_slots_full() -> bool:
        return (await _statuses(queue, flood)).count("processing") == 2

    await eventually(synthesis_slots_full, timeout=10)
    first = (await queue.enqueue(spec("preview"))).job_id
    await wait_for_status(queue, first, {"completed"}, timeout=10)
    assert on_interactive.ran == [first]
    assert sorted(await _statuses(queue, flood)) == ["processing"] * 2 + ["queued"] * 2

    interactive.stop()

    async def interactive_gone() -> bool:
        return not interactive.member.ticking

    await eventually(interactive_gone, timeout=10)
    second = (await queue.enqueue(spec("preview"))).job_id
    gate.set()
    later = (await queue.enqueue(spec("full"))).job_id
    for job_id in [*flood, later]:
        await wait_for_status(queue, job_id, {"completed"}, timeout=15)
    assert (await queue.get(second)).status.value == "queued"  # type: ignore[union-attr]
    assert sorted(on_synthesis.ran) == sorted([*flood, later])


async def test_a_worker_serving_both_classes_still_lends_idle_slots(
    queue: JobQueue, start_worker: WorkerFactory
) -> None:
    """The shared layout keeps the weighted slot pool: a worker of both classes (the default)
    runs full jobs in slots reserved for interactive work while no preview wants them."""
    gate = asyncio.Event()
    handler = GatedHandler(gate)
    await start_worker(handler, worker_concurrency=4)  # 3 interactive + 1 synthesis slots
    flood = [(await queue.enqueue(spec("full"))).job_id for _ in range(4)]

    async def all_running() -> bool:
        return (await _statuses(queue, flood)).count("processing") == 4

    await eventually(all_running, timeout=10)
    gate.set()
    for job_id in flood:
        await wait_for_status(queue, job_id, {"completed"}, timeout=10)


def test_class_lists_parse_and_name_the_process() -> None:
    """'interactive', 'synthesis', both or 'all'; an unknown class is refused by name."""
    assert parse_class_list("synthesis") == (StreamName.SYNTHESIS,)
    assert parse_class_list("synthesis, interactive") == STREAMS
    assert parse_class_list("all") == STREAMS
    assert parse_class_list("") == STREAMS
    with pytest.raises(ValueError, match="'bulk'"):
        parse_class_list("bulk")
    assert class_label((StreamName.INTERACTIVE,)) == "interactive"
    assert class_label(STREAMS) == ""
    assert lowers_process((StreamName.SYNTHESIS,), 19)
    assert not lowers_process((StreamName.SYNTHESIS,), 0)
    assert not lowers_process(STREAMS, 19)
    assert not lowers_process((StreamName.INTERACTIVE,), 19)


def test_settings_read_the_worker_classes_and_the_up_layout() -> None:
    """SPLATQ_WORKER_CLASSES and SPLATQ_UP_LAYOUT are read once and checked."""
    s = Settings.from_env({"SPLATQ_WORKER_CLASSES": "synthesis", "SPLATQ_UP_LAYOUT": "shared"})
    assert s.worker_classes == ("synthesis",)
    assert s.up_layout == "shared"
    defaults = Settings.from_env({})
    assert defaults.worker_classes == ("interactive", "synthesis")
    assert defaults.up_layout == "auto"
    with pytest.raises(SettingsError, match="SPLATQ_WORKER_CLASSES"):
        Settings.from_env({"SPLATQ_WORKER_CLASSES": "bulk"})
    with pytest.raises(SettingsError, match="SPLATQ_UP_LAYOUT"):
        Settings.from_env({"SPLATQ_UP_LAYOUT": "one-big-process"})


async def test_a_redis_backed_pool_of_one_class_reads_no_other_stream(
    queue: JobQueue, redis: Redis
) -> None:
    """take.lua given a one-class pool's counts (own = its slots, nothing lendable) starts
    that class's job and leaves the other class's entry unread in its stream."""
    from splatq.shared.engine.slots import SlotPool  # noqa: PLC0415

    await queue.setup()
    preview = (await queue.enqueue(spec("preview"))).job_id
    full = (await queue.enqueue(spec("full"))).job_id
    pool = SlotPool.create(4, 0.7, (StreamName.SYNTHESIS,))
    taken = await queue.take(0, pool.guaranteed_counts(), pool.lendable, "synthesis-only")
    assert [t.job.id for t in taken if t.job is not None] == [full]
    assert (await queue.get(preview)).status.value == "queued"  # type: ignore[union-attr]
