"""The staged pipeline under SIGKILL, with real processes (`splatq worker --stages ...`): a
kill at every stage boundary loses nothing and repeats no committed stage's work."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import pytest
from redis.asyncio import Redis

from splatq.shared.engine.jobs import JobSpec
from splatq.shared.engine.metering import UNIT_DIGEST_CHARS
from splatq.shared.engine.queue import JobQueue
from splatq.shared.engine.stages import PIPELINE, PipelineStage, StageRecord, StageStatus
from splatq.shared.redis.server import RedisServer
from splatq.shared.testing import (
    ServiceProcesses,
    eventually,
    job_events,
    service_env,
    wait_for_status,
)
from tests.helpers import REPO_ROOT
from tests.stage_handlers import expected_result, work_key

pytestmark = pytest.mark.slow

HANDLERS = "tests.stage_handlers:make"


async def _works(redis: Redis, job_id: str) -> dict[str, int]:
    return {s.value: int(await redis.get(work_key(job_id, s.value)) or 0) for s in PIPELINE}


async def test_a_sigkill_at_every_stage_boundary_loses_nothing_and_repeats_no_committed_stage(
    queue: JobQueue,
    redis: Redis,
    redis_server: RedisServer,
    tmp_path: Path,
) -> None:
    """One job is told to SIGKILL its worker right after each stage's work wrote its outputs
    (before that stage's commit): five kills, each followed by a fresh worker process. The job
    completes once, every stage's work before publish ran exactly once (a re-run reuses the
    stored outputs, and a committed stage is never run again), and `completed` is emitted
    once."""
    procs = ServiceProcesses(tmp_path, cwd=REPO_ROOT)
    env = service_env(
        redis_server.url,
        SPLATQ_STORAGE_URL=f"file://{tmp_path / 'objects'}",
        SPLATQ_STAGES="all",
        SPLATQ_STAGE_HANDLERS=HANDLERS,
    )
    job_id = (
        await queue.enqueue(
            JobSpec(
                tenant="acme",
                quality="preview",
                metadata={
                    # the work stages die before metering their stored outputs, publish after
                    # its work: the reuse meters each unit with the dead run's own time
                    "kill_before_meter": [s.value for s in PIPELINE[:-1]],
                    "kill_after_work": ["publish"],
                    "slow": {s.value: 0.05 for s in PIPELINE},
                },
            )
        )
    ).job_id
    try:
        kills = 0
        proc = procs.start(["worker"], env)
        for _ in range(len(PIPELINE) + 1):
            job = await queue.get(job_id)
            if job is not None and job.status.value == "completed":
                break

            async def died_or_done(p: subprocess.Popen[bytes] = proc) -> bool:
                j = await queue.get(job_id)
                return p.poll() is not None or (j is not None and j.status.value == "completed")

            await eventually(died_or_done, timeout=30)
            if proc.poll() is not None:
                assert proc.returncode == -9, proc.returncode
                kills += 1
                proc = procs.start(["worker"], env)
        job = await wait_for_status(queue, job_id, {"completed", "failed"}, timeout=30)
    finally:
        procs.kill_all()
    assert kills == len(PIPELINE)
    assert job.status.value == "completed", job.error
    assert job.artifacts == {"result": expected_result(job_id)}
    # publish copies into a folder of its own run and commits: the killed run committed
    # nothing, so its work ran again; every stage before it ran its work once
    assert await _works(redis, job_id) == {
        "ingest": 1,
        "reconstruct": 1,
        "export": 1,
        "render": 1,
        "publish": 2,
    }
    for stage in PIPELINE[:-1]:
        record = job.ledger[stage]
        assert record.status is StageStatus.SUCCEEDED
        assert record.skipped  # the run after the kill found the outputs and reused them
    types = await job_events(redis, queue, job_id)
    assert types.count("3d_reconstruction.completed") == 1
    assert types.count("3d_reconstruction.started") == 2  # ingest's two runs
    # every unit of work metered once, with the time of the run that did it (and died)
    assert sorted(u.split(".")[0] for u in job.metered) == sorted(s.value for s in PIPELINE[:-1])
    assert all(ms >= 50 for ms in job.metered.values()), job.metered
    assert job.compute_time_ms == sum(job.metered.values())


async def test_gpu_and_cpu_pods_share_the_work_and_a_killed_gpu_pod_is_replaced(
    queue: JobQueue,
    redis: Redis,
    redis_server: RedisServer,
    tmp_path: Path,
) -> None:
    """The deployment's shape: one process runs reconstruct (the GPU pod), another the rest
    (the CPU pod). The reconstruct process is SIGKILLed mid-stage; its replacement takes the
    stage over after the lease, and no other stage runs twice."""

    procs = ServiceProcesses(tmp_path, cwd=REPO_ROOT)
    base = {
        "SPLATQ_STORAGE_URL": f"file://{tmp_path / 'objects'}",
        "SPLATQ_STAGE_HANDLERS": HANDLERS,
    }
    gpu_env = service_env(redis_server.url, SPLATQ_STAGES="reconstruct", **base)
    cpu_env = service_env(
        redis_server.url, SPLATQ_STAGES="ingest,export,render,publish,cleanup", **base
    )
    ids = [
        (
            await queue.enqueue(
                JobSpec(tenant="acme", quality="preview", metadata={"slow": {"reconstruct": 1.5}})
            )
        ).job_id
        for _ in range(3)
    ]
    try:
        procs.start(["worker"], cpu_env)
        gpu = procs.start(["worker"], gpu_env)

        async def reconstructing() -> bool:
            keys = [work_key(j, PipelineStage.RECONSTRUCT.value) for j in ids]
            return any(int(v or 0) > 0 for v in await redis.mget(keys))

        await eventually(reconstructing, timeout=30)
        gpu.kill()
        gpu.wait(timeout=10)
        procs.start(["worker"], gpu_env)
        jobs = [await wait_for_status(queue, j, {"completed", "failed"}, timeout=60) for j in ids]
    finally:
        procs.kill_all()
    for job in jobs:
        assert job.status.value == "completed", job.error
        assert job.artifacts == {"result": expected_result(job.id)}
        works = await _works(redis, job.id)
        assert works["reconstruct"] in (1, 2)  # the killed run's work may not have finished
        assert {k: v for k, v in works.items() if k != "reconstruct"} == {
            "ingest": 1,
            "export": 1,
            "render": 1,
            "publish": 1,
        }


async def test_a_worker_stalled_past_its_lease_mid_stage_commits_nothing_when_it_wakes(
    queue: JobQueue,
    redis: Redis,
    redis_server: RedisServer,
    tmp_path: Path,
) -> None:
    """A worker process is SIGSTOPped in the middle of a stage for longer than its lease:
    another worker takes the stage over and finishes the job. When the stalled one wakes,
    its run's advance is fenced out (the lease token moved on): nothing is moved twice, no
    later stage runs again, `completed` goes out once, and the woken worker lives on."""
    import signal  # noqa: PLC0415

    procs = ServiceProcesses(tmp_path, cwd=REPO_ROOT)
    env = service_env(
        redis_server.url,
        SPLATQ_STORAGE_URL=f"file://{tmp_path / 'objects'}",
        SPLATQ_STAGES="all",
        SPLATQ_STAGE_HANDLERS=HANDLERS,
    )
    job_id = (
        await queue.enqueue(
            JobSpec(tenant="acme", quality="preview", metadata={"slow": {"reconstruct": 2.5}})
        )
    ).job_id
    try:
        stalled = procs.start(["worker"], env)

        async def reconstructing() -> bool:
            return int(await redis.get(work_key(job_id, "reconstruct")) or 0) == 1

        await eventually(reconstructing, timeout=30)
        stalled.send_signal(signal.SIGSTOP)
        procs.start(["worker"], env)
        job = await wait_for_status(queue, job_id, {"completed", "failed"}, timeout=30)
        stalled.send_signal(signal.SIGCONT)

        log = tmp_path / "worker-0.log"

        async def fenced_out() -> bool:
            # its 2.5 s of work end, then its commit is refused: an advance, or (the job has
            # been cleaned up meanwhile, its input gone) a failure -- either way lease_lost
            return log.exists() and "lease_lost" in log.read_text()

        await eventually(fenced_out, timeout=15)
        assert stalled.poll() is None
    finally:
        procs.kill_all()
    assert job.status.value == "completed", job.error
    assert job.ledger[PipelineStage.RECONSTRUCT].attempts == 2
    after = await queue.get(job_id)
    assert after is not None
    assert after.status.value == "completed"

    # the woken run changed no record: the ledger is the finisher's (cleanup aside: it may
    # have run meanwhile, dropping the outputs' names and all of the digests but what names
    # each metered unit)
    def as_cleaned(ledger: Mapping[PipelineStage, StageRecord]) -> dict[PipelineStage, StageRecord]:
        return {
            k: replace(v, outputs={}, digest=v.digest[:UNIT_DIGEST_CHARS])
            for k, v in ledger.items()
            if k is not PipelineStage.CLEANUP
        }

    assert as_cleaned(after.ledger) == as_cleaned(job.ledger)
    works = await _works(redis, job_id)
    assert works == {"ingest": 1, "reconstruct": 2, "export": 1, "render": 1, "publish": 1}
    # reconstruct ran twice, and is metered once: the stale run's meter was fenced out
    assert sorted(u.split(".")[0] for u in after.metered) == [
        "export", "ingest", "reconstruct", "render"
    ]  # fmt: skip
    types = await job_events(redis, queue, job_id)
    assert types.count("3d_reconstruction.completed") == 1
    # 4 later stages, each running + succeeded, and reconstruct's takeover ran once more
    assert types.count("3d_reconstruction.progress") == 9
