"""Issue #27: the CPU stage worker's resident memory comes back when its queue drains, and
does not grow from one window of jobs to the next (real processes: `splatq worker --stages`
for the CPU stages and for reconstruct, real Redis, local storage, the builtin model).

Measured as growth between windows, not as an absolute figure: the RSS of the CPU worker at
rest (handlers started, no job yet), once a warm-up window (two previews one after the other)
has drained, and once each later window (previews enqueued at once, several rendered at the
same time) has drained. Before the fix each thread that had rendered kept the peak of its
render (~325 MB) in its malloc arena, so even the warm-up left it ~300 MB bigger."""

from __future__ import annotations

from pathlib import Path

from splatq.shared.engine.queue import JobQueue
from splatq.shared.storage.store import LocalFileStorage
from splatq.shared.testing import eventually
from tests.gpu_worker.conftest import sample_png, stored_spec
from tests.system.conftest import SpawnService

CPU_STAGES = "ingest,export,render,publish,cleanup"
WINDOWS = 2
WINDOW_JOBS = 6


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


async def _run_window(queue: JobQueue, storage: LocalFileStorage, seeds: range) -> None:
    ids = [(await queue.enqueue(await stored_spec(storage, sample_png(s)))).job_id for s in seeds]

    async def all_ended() -> bool:
        jobs = [await queue.get(i) for i in ids]
        failed = [j for j in jobs if j is not None and j.status.value == "failed"]
        assert not failed, failed[0].error
        return all(j is not None and j.status.value == "completed" for j in jobs)

    await eventually(all_ended, timeout=120)


async def _ready(queue: JobQueue, pid: int) -> None:
    """Until the worker process ticked its fleet clock: its handlers started (model loaded)."""

    async def ticked() -> bool:
        members = await queue.redis.zrange(queue.keys.workers(0), 0, -1)
        return any(f"-{pid}-" in str(m) for m in members)

    await eventually(ticked, timeout=120)


async def test_cpu_worker_memory_returns_after_each_window_and_does_not_grow(
    queue: JobQueue, tmp_path: Path, spawn_service: SpawnService
) -> None:
    storage = LocalFileStorage(tmp_path / "objects")
    env = {
        "SPLATQ_STORAGE_URL": (tmp_path / "objects").as_uri(),
        "SPLATQ_DEVICE": "cpu",
        "SPLATQ_LOG_LEVEL": "warning",
    }
    url = queue.settings.redis_url
    spawn_service("worker", url, SPLATQ_STAGES="reconstruct", **env)
    cpu = spawn_service("worker", url, SPLATQ_STAGES=CPU_STAGES, **env)
    await _ready(queue, cpu.pid)
    at_rest = rss_mb(cpu.pid)

    for seed in (0, 1):  # warm-up: one job at a time (torch's kernels, every code path)
        await _run_window(queue, storage, range(seed, seed + 1))
    warm = rss_mb(cpu.pid)
    drained = []
    for w in range(WINDOWS):
        first = 10 + w * WINDOW_JOBS
        await _run_window(queue, storage, range(first, first + WINDOW_JOBS))
        drained.append(rss_mb(cpu.pid))
    report = (
        f"at rest {at_rest:.0f} MB, warm {warm:.0f} MB, drained after each window "
        f"{[round(r) for r in drained]} MB"
    )
    print(report)
    # what the jobs' work freed went back: drained, the worker is about as big as at rest
    assert max(warm, *drained) <= at_rest * 1.3, report
    # and no slope from window to window
    assert drained[-1] <= drained[0] * 1.1, report
