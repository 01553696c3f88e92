"""Per-class worker processes (`splatq worker --classes ...`), as `splatq up` lays them out:
each is its own failure domain and fleet member, and a synthesis-only process runs every
thread at the lower OS priority. Real processes, real Redis, a real poison job."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from redis.asyncio import Redis

from splatq.shared.engine.jobs import JobSpec
from splatq.shared.engine.queue import JobQueue
from splatq.shared.redis.server import RedisServer
from splatq.shared.testing import ServiceProcesses, eventually, service_env, wait_for_status
from tests.helpers import REPO_ROOT
from tests.stage_handlers import expected_result, poison_key
from tests.system.test_staged_crash_attribution import _dead_letter, _deaths, _Pod

pytestmark = pytest.mark.slow


def thread_nices(pid: int) -> dict[int, tuple[int, int]]:
    """(nice, scheduling policy) of every thread of a process (Linux: both per thread)."""
    nices = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            tid = int(task.name)
            nices[tid] = (os.getpriority(os.PRIO_PROCESS, tid), os.sched_getscheduler(tid))
        except OSError:  # a thread that just ended
            continue
    return nices


async def test_a_synthesis_process_runs_every_thread_niced_and_an_interactive_one_does_not(
    queue: JobQueue, redis_server: RedisServer, tmp_path: Path
) -> None:
    """With a job of its class in a blocking thread, every thread of the synthesis-only process
    (event loop, Redis, job threads) runs SPLATQ_SYNTHESIS_NICE lower than this test and under
    SCHED_IDLE, and every thread of the interactive-only process at this test's own priority
    and policy."""
    procs = ServiceProcesses(tmp_path, cwd=REPO_ROOT)
    env = service_env(redis_server.url, SPLATQ_JOB_HANDLER="tests.handlers:make")
    base = os.getpriority(os.PRIO_PROCESS, 0)
    try:
        by_class = {
            cls: procs.start(["worker", "--classes", cls], env)
            for cls in ("interactive", "synthesis")
        }
        jobs = {
            cls: (await queue.enqueue(JobSpec(tenant="acme", quality=q, metadata={"block_s": 30})))
            for cls, q in (("interactive", "preview"), ("synthesis", "full"))
        }
        for job in jobs.values():
            await wait_for_status(queue, job.job_id, {"processing"}, timeout=30)

        async def job_threads_started() -> bool:  # the event loop's thread and a job's
            return all(len(thread_nices(p.pid)) >= 2 for p in by_class.values())

        await eventually(job_threads_started, timeout=10)
        interactive = thread_nices(by_class["interactive"].pid)
        synthesis = thread_nices(by_class["synthesis"].pid)
    finally:
        procs.kill_all()
    assert set(synthesis.values()) == {(min(19, base + 19), os.SCHED_IDLE)}, synthesis
    assert set(interactive.values()) == {(base, os.sched_getscheduler(0))}, interactive


async def _processing(queue: JobQueue, job_id: str, stage: str) -> bool:
    job = await queue.get(job_id)
    return job is not None and job.status.value == "processing" and job.current_stage == stage


async def test_a_poison_full_job_kills_only_its_class_process(
    queue: JobQueue, redis: Redis, redis_server: RedisServer, tmp_path: Path
) -> None:
    """A full job whose export SIGKILLs its process, with a preview in its publish stage in
    the interactive process at the same moment: only the synthesis process dies (a fresh one
    after each death), each death is charged to the poison job alone (k = 1, no mass: the
    interactive process is another fleet member and keeps ticking) and it is dead-lettered
    after 3; the preview completes in its own process, delivered once, never charged."""
    bystander_spec = JobSpec(
        tenant="globex", quality="preview", metadata={"slow_once": {"publish": 20}}
    )
    bystander = (await queue.enqueue(bystander_spec)).job_id
    for sub in ("s", "i"):
        (tmp_path / sub).mkdir()
    synthesis = _Pod(redis_server, tmp_path / "s", SPLATQ_WORKER_CLASSES="synthesis")
    interactive = _Pod(redis_server, tmp_path / "i", SPLATQ_WORKER_CLASSES="interactive")
    try:
        await eventually(lambda: _processing(queue, bystander, "publish"), timeout=30)
        spec = JobSpec(tenant="acme", quality="full", metadata={"poison": ["export"]})
        poison = (await queue.enqueue(spec)).job_id
        await redis.set(poison_key(poison), 1000)  # every export run kills at once
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 120
        while (job := await queue.get(poison)) is None or job.status.value != "failed":
            assert loop.time() < deadline, "the poison job was not stopped"
            synthesis.replace_if_dead()
            assert synthesis.deaths <= 3, f"death {synthesis.deaths}: the limit is 3"
            await asyncio.sleep(0.05)
        done = await wait_for_status(queue, bystander, {"completed", "failed"}, timeout=60)
        assert interactive.proc.poll() is None
        assert interactive.deaths == 0
    finally:
        synthesis.procs.kill_all()
        interactive.procs.kill_all()
    assert synthesis.deaths == 3
    letter = await _dead_letter(redis, queue, poison)
    assert letter["reason"] == "max_deliveries_exceeded"
    assert letter["charge"] == "3.00"
    deaths = _deaths(letter["lapses"])
    assert [d[2:] for d in deaths] == [["1"], ["1"], ["1"]], letter["lapses"]
    assert done.status.value == "completed", done.error
    assert done.artifacts == {"result": expected_result(bystander)}
    assert done.delivery_charge == 0
    assert not await redis.hget(queue.keys.job(bystander), "lapses")
    assert done.deliveries == 1
