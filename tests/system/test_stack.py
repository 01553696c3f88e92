"""`splatq up` runs the staged pipeline: GPU worker processes for the device stages and CPU
worker processes for the rest, a process per job class by default, each on its own metrics
port, and "splatq is up" waits for every one to reach Redis (real Redis, real child
processes, a real HTTP /readyz over loopback)."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from splatq.services.cli.main import stage_service
from splatq.services.stack import (
    METRICS_PORT_OFFSETS,
    WORKER_STAGES,
    _wait_until_ready,
    consumer_pid,
    cuda_device_visible,
    services_to_run,
)
from splatq.shared.engine.fleet import new_consumer_name
from splatq.shared.engine.queue import JobQueue
from splatq.shared.engine.stages import ALL_STAGES, DEVICE_STAGES, PipelineStage, parse_stage_list
from splatq.shared.engine.worker_classes import parse_class_list
from splatq.shared.redis.server import free_port
from splatq.shared.settings import Settings
from splatq.shared.testing import eventually


def _workers(settings: Settings, cuda: bool) -> dict[str, tuple[tuple[PipelineStage, ...], str]]:
    """The stack's worker processes: name -> (stages, --classes or '')."""
    out = {}
    for spec in services_to_run(settings, cuda=cuda):
        if not spec.worker:
            continue
        argv = spec.argv
        assert argv[:4] == (sys.executable, "-m", "splatq.services.cli", "worker")
        assert argv[4] == "--stages"
        classes = argv[7] if argv[6:7] == ("--classes",) else ""
        assert len(argv) == (8 if classes else 6), argv
        out[spec.name] = (parse_stage_list(argv[5]), classes)
    return out


def test_the_default_stack_runs_a_worker_process_per_class_and_pod_kind() -> None:
    """Without CUDA (`splatq up`'s default layout, `auto`): a GPU and a CPU worker process
    for each class -- no process shares a class's CPU, GIL or device with the other -- and
    between the two processes of a class every stage runs once."""
    workers = _workers(Settings(metrics_port=9100), cuda=False)
    assert set(workers) == {
        "worker-gpu-interactive", "worker-gpu-synthesis",
        "worker-cpu-interactive", "worker-cpu-synthesis",
    }  # fmt: skip
    for cls in ("interactive", "synthesis"):
        gpu, cpu = workers[f"worker-gpu-{cls}"], workers[f"worker-cpu-{cls}"]
        assert gpu == (WORKER_STAGES["worker-gpu"], cls)
        assert cpu == (WORKER_STAGES["worker-cpu"], cls)
        assert set(gpu[0]) == DEVICE_STAGES
        assert set(gpu[0]) | set(cpu[0]) == set(ALL_STAGES)
        for name, (stages, classes) in ((f"worker-gpu-{cls}", gpu), (f"worker-cpu-{cls}", cpu)):
            # its logs and build info name its kind and class
            assert stage_service(stages, parse_class_list(classes)) == name
    assert stage_service(ALL_STAGES) == "worker"
    assert stage_service(WORKER_STAGES["worker-cpu"]) == "worker-cpu"
    assert _workers(Settings(up_layout="per-class"), cuda=True) == workers


def test_with_a_cuda_device_one_gpu_process_serves_both_classes() -> None:
    """One GPU, one device scheduler: the GPU worker serves both classes (its turns and
    stream priorities order them); the CPU workers stay per class."""
    workers = _workers(Settings(), cuda=True)
    assert workers["worker-gpu"] == (WORKER_STAGES["worker-gpu"], "")
    assert workers["worker-cpu-synthesis"] == (WORKER_STAGES["worker-cpu"], "synthesis")
    assert set(workers) == {"worker-gpu", "worker-cpu-interactive", "worker-cpu-synthesis"}


def test_the_shared_layout_is_one_process_per_pod_kind() -> None:
    """SPLATQ_UP_LAYOUT=shared: the layout before per-class processes (both classes in one
    GPU and one CPU worker)."""
    workers = _workers(Settings(up_layout="shared"), cuda=False)
    assert workers == {
        "worker-gpu": (WORKER_STAGES["worker-gpu"], ""),
        "worker-cpu": (WORKER_STAGES["worker-cpu"], ""),
    }


def test_the_stack_reads_the_device_setting_before_the_driver() -> None:
    """SPLATQ_DEVICE=cpu lays the GPU worker out per class whatever the host has; `cuda` keeps
    one GPU process."""
    assert not cuda_device_visible(Settings(device="cpu"))
    assert cuda_device_visible(Settings(device="cuda"))
    assert "worker-gpu-synthesis" in _workers(Settings(device="cpu"), cuda=False)


@pytest.mark.parametrize("layout", ["auto", "per-class", "shared"])
def test_each_service_serving_metrics_gets_its_own_port(layout: str) -> None:
    """Every process of every layout has an offset of its own on the metrics base."""
    specs = services_to_run(Settings(metrics_port=9100, up_layout=layout), cuda=False)
    ports = {s.name: int(s.env["SPLATQ_METRICS_PORT"]) for s in specs if s.env}
    assert set(ports) == {s.name for s in specs} <= set(METRICS_PORT_OFFSETS)
    assert len(set(ports.values())) == len(ports)
    if layout == "shared":
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
            _wait_until_ready(
                settings.with_overrides(gateway_port=port), children, {"worker-gpu", "worker-cpu"}
            )
        )

        async def turned() -> bool:
            return stand_in.hits >= 1

        await eventually(turned, timeout=15)
        await queue.fleet_tick([0], f"{host}-{gpu}-aaaaaa")
        seen = stand_in.hits

        async def turned_twice_more() -> bool:
            assert not ready.done(), "ready with one worker process of two"
            return stand_in.hits >= seen + 2

        await eventually(turned_twice_more, timeout=15)
        await queue.fleet_tick([0], f"{host}-{cpu}-bbbbbb")
        assert await asyncio.wait_for(ready, timeout=15) is True
    finally:
        for proc in children.values():
            proc.kill()
            await proc.wait()
