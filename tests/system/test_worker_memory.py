"""Issue #27: the CPU stage worker's resident memory comes back when its queue drains, and
does not grow from one window of jobs to the next (real processes: `splatq worker --stages`
for the CPU stages and for reconstruct, real Redis, local storage, the builtin model).

Measured as growth between windows, not as an absolute figure: the RSS of the CPU worker
once a warm-up window (two previews one after the other: model, torch, every code path) has
drained, against its RSS once each later window (previews enqueued at once, several rendered
at the same time) has drained. Before the fix each thread that had rendered kept the peak of
its render (~370 MB) in its malloc arena: +1 GB after the first concurrent window."""

from __future__ import annotations

import time
from pathlib import Path

from splatq.shared.engine.queue import JobQueue
from splatq.shared.storage.store import LocalFileStorage
from tests.conftest import wait_until
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

    await wait_until(all_ended, timeout_s=120)


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

    t0 = time.monotonic()
    for seed in (0, 1):  # warm-up: one job at a time
        await _run_window(queue, storage, range(seed, seed + 1))
    warm = rss_mb(cpu.pid)
    drained = []
    for w in range(WINDOWS):
        first = 10 + w * WINDOW_JOBS
        await _run_window(queue, storage, range(first, first + WINDOW_JOBS))
        drained.append(rss_mb(cpu.pid))
    print(f"took {time.monotonic() - t0:.0f} s")
    report = f"warm {warm:.0f} MB, drained after each window {[round(r) for r in drained]} MB"
    print(report)
    # what the jobs' work freed went back: drained, the worker is about as big as warmed up
    assert max(drained) <= warm * 1.2, report
    # and no slope from window to window
    assert drained[-1] <= drained[0] * 1.1, report
