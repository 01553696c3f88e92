"""Crash attribution counts processes: a staged worker process (`splatq worker --stages all`)
is one failure domain, whichever of its stage workers ran the job that killed it. Real
processes, a real poison job (its export SIGKILLs the process), a fresh process after each
death, SPLATQ_MAX_DELIVERIES=3."""

from __future__ import annotations

import asyncio
import subprocess
from functools import partial
from pathlib import Path

import pytest
from redis.asyncio import Redis

from splatq.shared.engine.jobs import JobSpec
from splatq.shared.engine.queue import JobQueue
from splatq.shared.redis.server import RedisServer
from splatq.shared.testing import ServiceProcesses, eventually, service_env, wait_for_status
from tests.helpers import REPO_ROOT
from tests.stage_handlers import expected_result, poison_key, poison_runs_key

pytestmark = pytest.mark.slow

HANDLERS = "tests.stage_handlers:make"
POISON = {"poison": ["export"]}


class _Pod:
    """One staged worker process running every stage, replaced by a fresh one after each
    death (SIGKILL), as a Deployment would."""

    def __init__(self, redis_server: RedisServer, tmp_path: Path, **env: str) -> None:
        self.procs = ServiceProcesses(tmp_path, cwd=REPO_ROOT)
        self.env = service_env(
            redis_server.url,
            SPLATQ_STORAGE_URL=f"file://{tmp_path / 'objects'}",
            SPLATQ_STAGES="all",
            SPLATQ_STAGE_HANDLERS=HANDLERS,
            **env,
        )
        self.deaths = 0
        self.proc = self.procs.start(["worker"], self.env)

    def replace_if_dead(self) -> bool:
        if self.proc.poll() is None:
            return False
        assert self.proc.returncode == -9, self.proc.returncode
        self.deaths += 1
        self.proc = self.procs.start(["worker"], self.env)
        return True

    async def wait_death(self) -> None:
        async def dead(p: subprocess.Popen[bytes] = self.proc) -> bool:
            return p.poll() is not None

        await eventually(dead, timeout=30)
        assert self.replace_if_dead()


def _deaths(lapses: str) -> list[list[str]]:
    """A lapse log ('<ms> <worker> <k>[ mass+N];...') as [ms, worker, k(, mass+N)] lists."""
    return [d.split() for d in lapses.split(";") if d]


async def _dead_letter(redis: Redis, queue: JobQueue, job_id: str) -> dict[str, str]:
    letters = [f for _, f in await redis.xrange(queue.keys.dead_letters(0)) if f["job"] == job_id]
    assert len(letters) == 1, letters
    return letters[0]


async def _processing_in(queue: JobQueue, job_id: str, stage: str) -> bool:
    job = await queue.get(job_id)
    return job is not None and job.status.value == "processing" and job.current_stage == stage


async def _failed_or_run(queue: JobQueue, redis: Redis, job_id: str, runs: str, n: int) -> bool:
    """The job was dead-lettered, or its poison stage's run `n` has started."""
    job = await queue.get(job_id)
    return (job is not None and job.status.value == "failed") or int(
        await redis.get(runs) or 0
    ) >= n


async def test_a_poison_export_in_an_all_stages_process_is_dead_lettered_after_max_deliveries(
    queue: JobQueue, redis: Redis, redis_server: RedisServer, tmp_path: Path
) -> None:
    """A job whose export SIGKILLs its process every time, in a process running every stage,
    a fresh process after each death: its deaths are the deaths of one process each, alone,
    so each is charged in full and it is dead-lettered after exactly 3 deaths -- not read as
    mass deaths (the process's other stage workers falling silent with it) and stopped only
    by the hard cap of 9. The process that replaces the last victim then completes another
    tenant's job."""
    spec = JobSpec(tenant="acme", quality="preview", metadata=POISON)
    poison = (await queue.enqueue(spec)).job_id
    await redis.set(poison_key(poison), 1000)  # every export run kills at once
    pod = _Pod(redis_server, tmp_path)
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 120
        while (job := await queue.get(poison)) is None or job.status.value != "failed":
            assert loop.time() < deadline, "the poison job was not stopped"
            if pod.replace_if_dead():
                lapses = await redis.hget(queue.keys.job(poison), "lapses")
                assert pod.deaths <= 3, f"death {pod.deaths}: the limit is 3 ({lapses}, {job})"
            await asyncio.sleep(0.05)
        other = JobSpec(tenant="globex", quality="preview")
        healthy = (await queue.enqueue(other)).job_id
        done = await wait_for_status(queue, healthy, {"completed", "failed"}, timeout=30)
        assert pod.proc.poll() is None
    finally:
        pod.procs.kill_all()
    assert pod.deaths == 3
    assert job.error is not None
    assert job.error.code == "dead_lettered"
    assert job.delivery_charge == pytest.approx(3.0)
    letter = await _dead_letter(redis, queue, poison)
    assert letter["reason"] == "max_deliveries_exceeded"
    assert letter["charge"] == "3.00"
    deaths = _deaths(letter["lapses"])
    assert [d[2:] for d in deaths] == [["1"], ["1"], ["1"]], letter["lapses"]  # alone, no mass
    assert len({d[1] for d in deaths}) == 3  # three processes, one name each
    assert done.status.value == "completed", done.error
    assert done.artifacts == {"result": expected_result(healthy)}


async def _co_running_is(redis: Redis, job_key: str, value: str) -> bool:
    """The job's record says its process runs `value` jobs (start and each renewal write it)."""
    return await redis.hget(job_key, "co_running") == value


async def test_a_job_that_dies_beside_a_poison_job_in_its_process_is_charged_one_share(
    queue: JobQueue, redis: Redis, redis_server: RedisServer, tmp_path: Path
) -> None:
    """Another tenant's job is in its publish stage when a poison job's export kills their
    shared process: both were running in the one process that died, so each is charged
    1/2 (k counts the process's jobs, whichever stage worker ran them) -- not 1 as if each
    had been alone on a worker of its own, and not 0 as if the process's other stage workers
    were other workers dying at the same time. The bystander then completes in the fresh
    process; the poison job, alone at each later death, is dead-lettered once its charge
    reaches the limit (1/2 + 1 + 1 + 1)."""
    slow_publish = {"slow_once": {"publish": 120}}
    bystander_spec = JobSpec(tenant="globex", quality="preview", metadata=slow_publish)
    bystander = (await queue.enqueue(bystander_spec)).job_id
    pod = _Pod(redis_server, tmp_path)
    try:
        await eventually(lambda: _processing_in(queue, bystander, "publish"), timeout=30)
        spec = JobSpec(tenant="acme", quality="preview", metadata=POISON)
        poison = (await queue.enqueue(spec)).job_id
        runs = poison_runs_key(poison, "export")
        await eventually(lambda: _failed_or_run(queue, redis, poison, runs, 1), timeout=30)
        # Both jobs' records say how many jobs their process runs (start and renew keep it).
        both = (bystander, poison)

        async def co_running() -> bool:
            shared = [await redis.hget(queue.keys.job(j), "co_running") for j in both]
            assert shared == ["2", "2"], f"co_running {shared}: one process runs both jobs"
            return True

        await eventually(co_running, timeout=5, interval=0.05, retry_on=AssertionError)
        await redis.set(poison_key(poison), 1)
        await pod.wait_death()
        done = await wait_for_status(queue, bystander, {"completed", "failed"}, timeout=30)
        while True:
            n = pod.deaths + 1
            await eventually(partial(_failed_or_run, queue, redis, poison, runs, n), timeout=30)
            job = await queue.get(poison)
            if job is not None and job.status.value == "failed":
                break
            assert n <= 4, f"death {n}: the limit is 3, charged 1/2 + 1 + 1 + 1 ({job})"
            # Alone at this death: the bystander's last work in the fresh process (its
            # cleanup) may still be running there, which would make k = 2 rightly.
            await eventually(lambda: _co_running_is(redis, queue.keys.job(poison), "1"), timeout=10)
            await redis.set(poison_key(poison), n)
            await pod.wait_death()
    finally:
        pod.procs.kill_all()
    assert done.status.value == "completed", done.error
    assert done.artifacts == {"result": expected_result(bystander)}
    assert done.delivery_charge == pytest.approx(0.5)
    [(_, worker, k)] = _deaths(str(await redis.hget(queue.keys.job(bystander), "lapses")))
    assert k == "2"
    assert pod.deaths == 4
    assert job.error is not None
    assert job.error.code == "dead_lettered"
    letter = await _dead_letter(redis, queue, poison)
    assert letter["charge"] == "3.50", (letter.get("charge"), letter.get("lapses"))
    deaths = _deaths(letter["lapses"])
    assert [d[2:] for d in deaths] == [["2"], ["1"], ["1"], ["1"]], letter["lapses"]
    assert deaths[0][1] == worker  # the two jobs died in one process, under one name
