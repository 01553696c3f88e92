"""Operator commands as processes: `splatq info`, `splatq worker --burst`, the `--check`
probes, `splatq submit --metadata --webhook-events` with its progress line on a terminal,
and `splatq up` with SPLATQ_METRICS_PORT (a port per service)."""

from __future__ import annotations

import asyncio
import os
import pty
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis

from splatq.services.stack import ALL_WORKERS, METRICS_PORT_OFFSETS, services_to_run
from splatq.shared.engine.queue import JobQueue
from splatq.shared.engine.stages import ALL_STAGES
from splatq.shared.redis.server import RedisServer, free_port
from splatq.shared.settings import Settings
from splatq.shared.testing import (
    engine_settings,
    eventually,
    running_redis_server,
    service_env,
)
from tests.gpu_worker.conftest import sample_png
from tests.helpers import REPO_ROOT, spec
from tests.system.conftest import SpawnService, SpawnWorker
from tests.system.test_cli import KEY, gateway_url  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow


@pytest.fixture
async def own_redis(tmp_path: Path) -> AsyncIterator[RedisServer]:
    """A Redis of this test alone: `info` and `--burst` look at every stream in it."""
    async with running_redis_server(tmp_path / "redis", appendonly=True) as server:
        yield server


@pytest.fixture
async def own_queue(own_redis: RedisServer) -> AsyncIterator[JobQueue]:
    redis = Redis.from_url(own_redis.url, decode_responses=True)
    queue = JobQueue(redis, engine_settings(own_redis.url))
    await queue.setup()
    yield queue
    await redis.aclose()


async def splatq(*args: str, env: dict[str, str], timeout_s: float = 120) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "splatq.services.cli", *args,
        cwd=REPO_ROOT, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), timeout=timeout_s)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_info_shows_depth_waiting_age_pending_and_consumers(
    own_redis: RedisServer, own_queue: JobQueue
) -> None:
    for _ in range(3):
        await own_queue.enqueue(spec("preview"))
    await own_queue.enqueue(spec("full"))
    env = service_env(own_redis.url)
    code, out, err = await splatq("info", "--json", env=env)
    assert code == 0, err
    rows = {r["stream"]: r for r in orjson.loads(out)}
    assert set(rows) == {"interactive", "synthesis"}
    interactive, synthesis = rows["interactive"], rows["synthesis"]
    # fair scheduling keeps one ready in the stream, the rest in the tenant's queue
    assert (interactive["queued"], interactive["ready"], interactive["waiting"]) == (2, 1, 3)
    assert (synthesis["queued"], synthesis["ready"], synthesis["waiting"]) == (0, 1, 1)
    assert interactive["depth"] == 1
    assert interactive["oldest_waiting_s"] >= 0
    assert interactive["pending"] == 0
    assert interactive["consumers"] == 0
    assert interactive["delayed"] == 0

    # the ready entry handed to a consumer: pending 1, two still waiting (queued), a consumer
    taken = await own_queue.wait_for_new(0, [spec("preview").stream], "c1", 100)
    assert len(taken) == 1
    code, out, _ = await splatq("info", "--json", env=env)
    interactive = next(r for r in orjson.loads(out) if r["stream"] == "interactive")
    assert (interactive["waiting"], interactive["pending"], interactive["consumers"]) == (2, 1, 1)
    assert interactive["oldest_waiting_s"] is not None

    code, out, _ = await splatq("info", env=env)
    assert code == 0
    header, *lines = out.splitlines()
    assert header.split() == ["partition", "stream", "depth", "queued", "ready", "waiting",
                              "oldest_waiting_s", "pending", "consumers", "delayed"]  # fmt: skip
    assert len(lines) == 2

    code, _, err = await splatq("info", env=service_env(f"redis://127.0.0.1:{free_port()}/0"))
    assert code == 4
    assert "cannot read Redis" in err


async def test_info_shows_the_stages_a_job_has_reached(
    own_redis: RedisServer, own_queue: JobQueue
) -> None:
    """A job past ingest waits on the reconstruct stream: `info` gets a `reconstruct:<class>`
    row with it; stages nothing reached get none."""
    from splatq.shared.engine.keys import StreamName  # noqa: PLC0415
    from splatq.shared.engine.queue import Advance  # noqa: PLC0415
    from splatq.shared.engine.stages import PipelineStage  # noqa: PLC0415

    job_id = (await own_queue.enqueue(spec("preview"))).job_id
    ingest = own_queue.for_stage(PipelineStage.INGEST)
    [taken] = await ingest.take(0, {StreamName.INTERACTIVE: 1}, 0, "c1")
    status, _ = await ingest.advance(
        Advance(job_id, StreamName.INTERACTIVE, taken.entry.entry_id, taken.token, "ingest",
                "reconstruct", '{"status":"succeeded"}', 0.2, '"stage":"ingest"')
    )  # fmt: skip
    assert status == "ok"
    code, out, err = await splatq("info", "--json", env=service_env(own_redis.url))
    assert code == 0, err
    rows = {r["stream"]: r for r in orjson.loads(out)}
    assert set(rows) == {"interactive", "synthesis", "reconstruct:interactive"}
    stage = rows["reconstruct:interactive"]
    assert (stage["queued"], stage["ready"], stage["waiting"], stage["pending"]) == (0, 1, 1, 0)
    assert rows["interactive"]["waiting"] == 0


async def test_a_burst_worker_drains_everything_then_exits_0(
    own_redis: RedisServer, own_queue: JobQueue
) -> None:
    """Jobs, one of them retried after 1.5 s in the delayed set (nothing in any stream then):
    the burst worker stays for it, runs everything, and exits 0 by itself."""
    ids = [(await own_queue.enqueue(spec(sleep_s=0.2))).job_id for _ in range(3)]
    ids.append((await own_queue.enqueue(spec(fail="transient_once"))).job_id)
    env = service_env(own_redis.url, SPLATQ_RETRY_BASE_MS="1500", SPLATQ_RETRY_CAP_MS="1500")
    code, out, err = await splatq(
        "worker", "--handler", "tests.handlers:make", "--burst", env=env, timeout_s=120
    )
    assert code == 0, err[-3000:]
    assert "worker.burst_drained" in out + err
    for job_id in ids:
        job = await own_queue.get(job_id)
        assert job is not None
        assert job.status.value == "completed", (job_id, job.status)
    retried = await own_queue.get(ids[-1])
    assert retried is not None
    assert retried.attempts == 2


async def test_a_burst_worker_with_nothing_to_do_exits_0(own_redis: RedisServer) -> None:
    code, _, err = await splatq(
        "worker", "--handler", "tests.handlers:make", "--burst", env=service_env(own_redis.url)
    )
    assert code == 0, err[-3000:]


async def test_check_probes_exit_0_when_healthy_and_1_when_not(
    own_redis: RedisServer, spawn_service: SpawnService
) -> None:
    good = service_env(own_redis.url)
    bad = service_env(f"redis://127.0.0.1:{free_port()}/0")
    services = ("worker", "dispatcher", "redriver", "settler")
    *results, (bad_code, bad_out, _) = await asyncio.gather(
        *(splatq(service, "--check", env=good) for service in services),
        splatq("worker", "--check", env=bad),  # the same probe for all four
    )
    for service, (code, out, _) in zip(services, results, strict=True):
        assert (code, out.split(":")[0]) == (0, service), out
        assert "healthy (redis: PING ok)" in out
    assert bad_code == 1, bad_out
    assert "unhealthy" in bad_out

    port = free_port()
    overrides = {"SPLATQ_GATEWAY_PORT": str(port), "SPLATQ_GATEWAY_HOST": "0.0.0.0",
                 "SPLATQ_API_KEYS": f"acme:{KEY}"}  # fmt: skip
    env = service_env(own_redis.url, **overrides)
    code, out, _ = await splatq("gateway", "--check", env=env)
    assert code == 1  # nothing listens yet
    assert f"127.0.0.1:{port}/readyz" in out
    gateway = spawn_service("gateway", own_redis.url, **overrides)
    async with aiohttp.ClientSession() as http:

        async def ready() -> bool:
            try:
                async with http.get(f"http://127.0.0.1:{port}/readyz") as resp:
                    return resp.status == 200
            except aiohttp.ClientError:
                return False

        await eventually(ready, timeout=60, interval=0.1)
    code, out, _ = await splatq("gateway", "--check", env=env)
    assert code == 0, out
    assert "gateway: healthy" in out
    gateway.send_signal(signal.SIGKILL)
    gateway.wait(timeout=10)
    assert (await splatq("gateway", "--check", env=env))[0] == 1


async def test_submit_sends_metadata_and_webhook_events_and_clears_its_progress_line(
    gateway_url: str,  # noqa: F811 - the fixture
    redis_server: RedisServer,
    queue: JobQueue,
    spawn_worker: SpawnWorker,
    tmp_path: Path,
) -> None:
    """On a terminal (a pty), `submit --wait` rewrites one progress line and erases it
    before the final event's line; --metadata and --webhook-events reach the job."""
    spawn_worker(redis_server.url)
    image = tmp_path / "figure.png"
    image.write_bytes(sample_png(5))
    master, slave = pty.openpty()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "splatq.services.cli", "submit", str(image), "--quality",
        "preview", "--no-cache", "--wait", "--metadata", '{"sleep_s": 0.6, "scene": "desk"}',
        "--webhook", "https://hooks.example.com/x", "--webhook-events", "completed,failed",
        "--api-url", gateway_url, "--api-key", KEY,
        cwd=REPO_ROOT, stdout=asyncio.subprocess.PIPE, stderr=slave,
        env={**service_env(redis_server.url), "SPLATQ_WEBHOOK_ALLOW_PRIVATE": "1"},
    )  # fmt: skip
    os.close(slave)
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=120)
    screen = await asyncio.to_thread(_drain, master)
    assert proc.returncode == 0, screen
    job_id, status, _ = out.decode().split(maxsplit=2)
    assert status == "completed"
    assert "\r  [" in screen  # the bar, rewritten in place
    assert "\r\x1b[2K  completed\r\n" in screen  # erased before the final line
    job = await queue.get(job_id)
    assert job is not None
    assert job.metadata == {"sleep_s": 0.6, "scene": "desk"}
    assert set(job.webhook_events) == {"3d_reconstruction.completed", "3d_reconstruction.failed"}

    code, _, err = await _submit_refused(gateway_url, image, "--metadata", "[1, 2]")
    assert code == 2
    assert "JSON object" in err
    code, _, err = await _submit_refused(gateway_url, image, "--webhook-events", "finished")
    assert code == 2
    assert "unknown event" in err


async def _submit_refused(url: str, image: Path, *extra: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPLATQ_")}
    return await splatq("submit", str(image), *extra, "--api-url", url, "--api-key", KEY,
                        env=env)  # fmt: skip


def _drain(fd: int) -> str:
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the other side is closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks).decode(errors="replace")


def _free_port_run(count: int) -> int:
    """A base port with the `count - 1` ports after it free too."""
    for _ in range(50):
        base = free_port()
        try:
            for offset in range(1, count):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", base + offset))
        except OSError:
            continue
        return base
    raise AssertionError(f"no {count} consecutive free ports")


async def test_up_gives_each_service_its_own_metrics_port(tmp_path: Path) -> None:
    """With SPLATQ_METRICS_PORT set the GPU and CPU workers (a process per class), the
    dispatcher, the redriver and the settler each serve /metrics on base + their offset, and
    the stack keeps running (one shared port killed the worker and with it the stack). The
    workers run the staged pipeline between them: each samples the stage gauges and names its
    own pod kind and class."""
    base = _free_port_run(max(METRICS_PORT_OFFSETS.values()) + 1)
    gateway_port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPLATQ_")}
    env.update({"SPLATQ_METRICS_PORT": str(base), "SPLATQ_GATEWAY_PORT": str(gateway_port),
                "SPLATQ_LOG_FORMAT": "json", "PYTHONUNBUFFERED": "1"})  # fmt: skip
    log = (tmp_path / "up.log").open("wb")
    stack = subprocess.Popen(  # noqa: ASYNC220 - returns at once; readiness is polled below
        [sys.executable, "-m", "splatq.services.cli", "up", "--data-dir", str(tmp_path / "var"),
         "--redis-port", str(free_port())],
        cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    # the processes of the layout `splatq up` picks here (auto: per class without CUDA)
    names = [s.name for s in services_to_run(Settings())]
    workers = [n for n in names if n in ALL_WORKERS]
    ports = {name: base + METRICS_PORT_OFFSETS[name] for name in names}
    try:
        async with aiohttp.ClientSession() as http:

            async def all_serve() -> bool:
                assert stack.poll() is None, (tmp_path / "up.log").read_text()[-3000:]
                for port in ports.values():
                    try:
                        async with http.get(f"http://127.0.0.1:{port}/metrics") as resp:
                            if resp.status != 200:
                                return False
                    except aiohttp.ClientError:
                        return False
                return True

            await eventually(all_serve, timeout=90, interval=0.2)
            families = {}
            for name, port in ports.items():
                async with http.get(f"http://127.0.0.1:{port}/metrics") as resp:
                    families[name] = await resp.text()
        # each port is its own service's registry
        for name, text in families.items():
            assert f'service="{name}"' in text, (name, text[:2000])
        for worker in workers:
            assert "splatq_queue_depth" in families[worker]
            assert "splatq_stage_runs_total" in families[worker]
            assert "splatq_webhook_attempts_total" not in families[worker]
        assert "splatq_webhook_attempts_total" in families["dispatcher"]
        assert "splatq_redrives_total" in families["redriver"]
        assert stack.poll() is None

        async def up() -> bool:  # past its readiness wait: Ctrl-C now stops it cleanly
            assert stack.poll() is None
            return "splatq is up" in (tmp_path / "up.log").read_text()

        await eventually(up, timeout=120, interval=0.2)
        async with aiohttp.ClientSession() as http:

            async def stage_gauges_sampled() -> bool:
                # each staged worker samples every stage's gauges (the GPU scaler reads them)
                for worker in workers:
                    async with http.get(f"http://127.0.0.1:{ports[worker]}/metrics") as resp:
                        text = await resp.text()
                    sampled = {
                        sample.labels["stage"]
                        for family in text_string_to_metric_families(text)
                        if family.name == "splatq_stage_depth"
                        for sample in family.samples
                    }
                    if sampled != {s.value for s in ALL_STAGES}:
                        return False
                return True

            await eventually(stage_gauges_sampled, timeout=30, interval=0.2)
        stack.send_signal(signal.SIGINT)
        assert stack.wait(timeout=60) == 0
    finally:
        if stack.poll() is None:
            stack.kill()
            stack.wait(timeout=10)
        log.close()
