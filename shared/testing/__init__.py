"""Helpers for testing code that runs on splatq (your handlers, your services) against the
real thing: a `redis-server` child process, the engine's workers in your test's event loop,
splatq's own processes, and one poll, `eventually`, for everything that happens "soon".

    from splatq.shared.testing import (
        InProcessWorkers, engine_settings, eventually, fresh_redis, running_redis_server,
        wait_for_status,
    )

    async def test_my_handler_completes() -> None:
        async with running_redis_server() as server, fresh_redis(server.url) as redis:
            settings = engine_settings(server.url)
            queue = JobQueue(redis, settings)
            await queue.setup()
            workers = InProcessWorkers(redis, settings, MyHandler())
            await workers.start()
            try:
                job_id = (await queue.enqueue(JobSpec(tenant="t", quality="preview"))).job_id
                job = await wait_for_status(queue, job_id, {"completed"})
            finally:
                await workers.stop_all()

Nothing here imports pytest: the helpers are plain functions, context managers and classes
that any runner can use (docs/testing.md shows pytest fixtures over them). `redis-server`
must be on PATH.
"""

from splatq.shared.testing.engine import (
    InProcessWorkers,
    StagedWorkers,
    StagesFactory,
    WorkerFactory,
    engine_settings,
    finish_or_cancel,
    job_events,
    run_burst,
    wait_for_status,
)
from splatq.shared.testing.poll import eventually, eventually_sync
from splatq.shared.testing.processes import ServiceProcesses, service_env
from splatq.shared.testing.redis import (
    RedisServer,
    RedisServerError,
    free_port,
    fresh_redis,
    running_redis_server,
)

__all__ = [
    "InProcessWorkers",
    "RedisServer",
    "RedisServerError",
    "ServiceProcesses",
    "StagedWorkers",
    "StagesFactory",
    "WorkerFactory",
    "engine_settings",
    "eventually",
    "eventually_sync",
    "finish_or_cancel",
    "free_port",
    "fresh_redis",
    "job_events",
    "run_burst",
    "running_redis_server",
    "service_env",
    "wait_for_status",
]
