"""The GPU worker process killed between writing its artifacts and committing them."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from splatq.services.gpu_worker import formats
from splatq.shared.engine.queue import JobQueue
from splatq.shared.redis.server import RedisServer
from splatq.shared.storage.store import ARTIFACT_FILES, LocalFileStorage, artifact_key
from splatq.shared.testing import eventually, job_events, wait_for_status
from tests.gpu_worker.conftest import sample_png, stored_spec
from tests.system.conftest import SpawnWorker

pytestmark = pytest.mark.slow


async def test_sigkill_between_artifact_write_and_commit_completes_once_with_whole_files(
    queue: JobQueue,
    redis: Redis,
    redis_server: RedisServer,
    spawn_worker: SpawnWorker,
    storage: LocalFileStorage,
) -> None:
    """The first worker dies after staging and verifying the artifacts, before committing any:
    nothing is visible at the final keys; another worker re-runs the job, which completes
    exactly once with whole artifacts and no temporary file left behind."""
    job = await queue.enqueue(await stored_spec(storage, sample_png(3)))
    env = {"SPLATQ_STORAGE_URL": f"file://{storage.root}", "SPLATQ_DEVICE": "cpu"}
    victim = spawn_worker(redis_server.url, "tests.gpu_handlers:make_crash_on_commit", **env)

    async def died() -> bool:
        return victim.poll() is not None

    await eventually(died, timeout=60)
    assert (storage.root / "crash-marker").exists()  # it died where we meant it to
    for filename in ARTIFACT_FILES.values():
        assert not await storage.exists(artifact_key(job.job_id, filename, "a1"))
    staged_left = list(storage.path_of(f"jobs/{job.job_id}/a1").iterdir())
    assert staged_left  # the killed attempt's staged files exist, hidden, until swept

    spawn_worker(redis_server.url, "tests.gpu_handlers:make_crash_on_commit", **env)
    done = await wait_for_status(queue, job.job_id, {"completed"}, timeout=60)
    assert done.attempts == 2
    assert (await job_events(redis, queue, job.job_id)).count("3d_reconstruction.completed") == 1
    count = int(await redis.hget(queue.keys.job(job.job_id), "gaussian_count") or 0)
    files = {
        n: await storage.get_bytes(artifact_key(job.job_id, f, done.artifact_run))
        for n, f in ARTIFACT_FILES.items()
    }
    assert formats.verify_ply(files["gaussian_ply"], expected_count=count).count == count > 0
    assert formats.verify_splat(files["splat"], expected_count=count) == count
    formats.verify_png(files["rendered_preview"], 128, 128)
    job_dir = storage.path_of(f"jobs/{job.job_id}")
    names = sorted(str(p.relative_to(job_dir)) for p in job_dir.rglob("*") if p.is_file())
    # The second run's whole files, and no temporary file of the killed first run left.
    assert done.artifact_run == "a2"
    assert names == sorted(f"a2/{f}" for f in ARTIFACT_FILES.values())
