"""`splatq up` runs the staged pipeline: a GPU worker process for the device stages and a CPU
worker process for the rest, each on its own metrics port, and "splatq is up" waits for both
to reach Redis (real Redis, real child processes, a real HTTP /readyz over loopback)."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from splatq.services.cli import stage_service
from splatq.services.stack import (
    METRICS_PORT_OFFSETS,
    WORKER_STAGES,
    _wait_until_ready,
    consumer_pid,
    services_to_run,
)
from splatq.shared.engine.fleet import new_consumer_name
from splatq.shared.engine.queue import JobQueue
from splatq.shared.engine.stages import ALL_STAGES, DEVICE_STAGES, parse_stage_list
from splatq.shared.redis.server import free_port
from splatq.shared.settings import Settings
from tests.conftest import wait_until


def test_the_stack_runs_every_stage_once_across_a_gpu_and_a_cpu_worker() -> None:
    specs = {s.name: s for s in services_to_run(Settings(metrics_port=9100))}
    assert "worker" not in specs  # no whole-job worker beside the staged ones
    stages = {}
    for name in ("worker-gpu", "worker-cpu"):
        argv = specs[name].argv
        assert argv[:4] == (sys.executable, "-m", "splatq.services.cli", "worker")
        assert argv[4] == "--stages"
        stages[name] = parse_stage_list(argv[5])
        assert stages[name] == WORKER_STAGES[name]
        assert stage_service(stages[name]) == name  # its logs and build info name its kind
    assert set(stages["worker-gpu"]) == DEVICE_STAGES
    assert not set(stages["worker-gpu"]) & set(stages["worker-cpu"])
    assert set(stages["worker-gpu"]) | set(stages["worker-cpu"]) == set(ALL_STAGES)
    assert stage_service(ALL_STAGES) == "worker"


def test_each_service_serving_metrics_gets_its_own_port() -> None:
    specs = services_to_run(Settings(metrics_port=9100))
    ports = {s.name: int(s.env["SPLATQ_METRICS_PORT"]) for s in specs if s.env}
    assert set(ports) == set(METRICS_PORT_OFFSETS)
    assert len(set(ports.values())) == len(ports)
    assert ports["worker-gpu"] == 9100  # the single worker's port before the split
    assert all(not s.env for s in services_to_run(Settings(metrics_port=0)))


def test_consumer_pid_reads_the_engine_consumer_names() -> None:
    assert consumer_pid(new_consumer_name()) == os.getpid()
    host = socket.gethostname()
    assert consumer_pid(f"{host}-123-abcdef") == 123
    assert consumer_pid(f"not-{host}-123-abcdef") is None  # another host's worker
    assert consumer_pid(f"{host}-abc-abcdef") is None
    assert consumer_pid("parking") is None


class StandInGateway:
    """Answers /readyz 200 and counts the calls: each one is a turn of the readiness loop."""

    def __init__(self) -> None:
        self.hits = 0

    async def readyz(self, request: web.Request) -> web.Response:
        self.hits += 1
        return web.json_response({"status": "ready"})


@pytest.fixture
async def gateway() -> AsyncIterator[tuple[StandInGateway, int]]:
    stand_in = StandInGateway()
    app = web.Application()
    app.router.add_get("/readyz", stand_in.readyz)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield stand_in, port
    await runner.cleanup()


async def test_up_waits_for_both_worker_processes(
    queue: JobQueue, settings: Settings, gateway: tuple[StandInGateway, int]
) -> None:
    """Ready once each worker process has ticked a fleet clock since the wait began: one
    worker's tick is not enough, nor is a tick from before the wait."""
    stand_in, port = gateway
    children = {
        name: await asyncio.create_subprocess_exec("sleep", "120")
        for name in ("gateway", "worker-gpu", "worker-cpu", "dispatcher")
    }
    host = socket.gethostname()
    gpu, cpu = children["worker-gpu"].pid, children["worker-cpu"].pid
    try:
        await queue.fleet_tick([0], f"{host}-{cpu}-000000")  # before the wait: does not count
        ready = asyncio.create_task(
            _wait_until_ready(settings.with_overrides(gateway_port=port), children)
        )

        async def turned() -> bool:
            return stand_in.hits >= 1

        await wait_until(turned, timeout_s=15)
        await queue.fleet_tick([0], f"{host}-{gpu}-aaaaaa")
        seen = stand_in.hits

        async def turned_twice_more() -> bool:
            assert not ready.done(), "ready with one worker process of two"
            return stand_in.hits >= seen + 2

        await wait_until(turned_twice_more, timeout_s=15)
        await queue.fleet_tick([0], f"{host}-{cpu}-bbbbbb")
        assert await asyncio.wait_for(ready, timeout=15) is True
    finally:
        for proc in children.values():
            proc.kill()
            await proc.wait()
