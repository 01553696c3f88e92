"""Observability of real service processes: every stderr line is JSON (library logs and crash
tracebacks included), the gateway says where it listens, `/livez` fails while a worker's event
loop is stuck (and `/metrics` still answers), and the SLO metrics a worker and a gateway expose.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from prometheus_client.parser import text_string_to_metric_families

from splatq.shared.engine.queue import JobQueue
from splatq.shared.redis.server import RedisServer, free_port
from splatq.shared.testing import eventually, wait_for_status
from tests.helpers import spec
from tests.system.conftest import SpawnService, SpawnWorker


def log_path(proc: subprocess.Popen[bytes]) -> Path:
    """The file the spawn fixtures send a process's stdout and stderr to."""
    return Path(os.readlink(f"/proc/{proc.pid}/fd/2"))


def json_lines(path: Path) -> list[dict[str, Any]]:
    """Every line of a service's output, each parsed as one JSON object (fails otherwise)."""
    lines = path.read_bytes().splitlines()
    parsed = []
    for number, line in enumerate(lines, 1):
        try:
            event = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise AssertionError(f"line {number} of {path} is not JSON: {line!r}") from exc
        assert isinstance(event, dict), line
        assert {"event", "level", "timestamp"} <= event.keys(), event
        parsed.append(event)
    return parsed


async def http_get(url: str) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http,
        http.get(url) as resp,
    ):
        return resp.status, await resp.text()


async def reachable_status(url: str) -> int | None:
    try:
        status, _ = await http_get(url)
    except (aiohttp.ClientError, TimeoutError):
        return None
    return status


def samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    by_name: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            by_name.setdefault(sample.name, []).append((sample.labels, sample.value))
    return by_name


async def stop(proc: subprocess.Popen[bytes]) -> int:
    proc.send_signal(signal.SIGTERM)

    async def exited() -> bool:
        return proc.poll() is not None

    await eventually(exited, timeout=30)
    assert proc.returncode is not None
    return proc.returncode


async def test_worker_liveness_fails_while_its_loop_is_blocked(
    redis_server: RedisServer, queue: JobQueue, spawn_worker: SpawnWorker
) -> None:
    port = free_port()
    proc = spawn_worker(
        redis_server.url, SPLATQ_METRICS_PORT=str(port), SPLATQ_LIVENESS_MAX_AGE_S="3"
    )
    path = log_path(proc)
    livez, metrics = f"http://127.0.0.1:{port}/livez", f"http://127.0.0.1:{port}/metrics"

    async def status_is(url: str, wanted: int) -> bool:
        return await reachable_status(url) == wanted

    await eventually(lambda: status_is(livez, 200), timeout=60, interval=0.1)
    # A handler that calls time.sleep on the event loop: the loop stops beating.
    blocked = await queue.enqueue(spec(loop_block_s=10, stdlib_log="hello"))
    await eventually(lambda: status_is(livez, 503), timeout=60, interval=0.1)
    # ... because of that job (3 s without a beat is no scheduling hiccup).
    job = await queue.get(blocked.job_id)
    assert job is not None
    assert job.status.value == "processing"
    # ... while /metrics, served from the same thread as /livez, still answers.
    status, _ = await http_get(metrics)
    assert status == 200
    _, body = await http_get(livez)
    assert body.startswith("stuck"), body
    # The loop beats again once the handler returns.
    await eventually(lambda: status_is(livez, 200), timeout=60, interval=0.1)
    await wait_for_status(queue, blocked.job_id, {"completed"}, timeout=30)

    # The SLO histograms of the job, per stream and quality; no sentinel values.
    async def observed() -> bool:
        _, text = await http_get(metrics)
        return "splatq_job_end_to_end_duration_seconds_count" in text

    await eventually(observed, timeout=30, interval=0.1)
    _, text = await http_get(metrics)
    found = samples(text)
    wait = found["splatq_job_queue_wait_duration_seconds_count"]
    assert ({"stream": "interactive", "quality": "preview"}, 1.0) in wait
    e2e = found["splatq_job_end_to_end_duration_seconds_count"]
    assert ({"stream": "interactive", "quality": "preview", "outcome": "completed"}, 1.0) in e2e
    e2e_sum = found["splatq_job_end_to_end_duration_seconds_sum"][0][1]
    assert e2e_sum >= 10  # the job blocked for 10 s: end-to-end includes its run
    assert found["splatq_build_info"][0][0]["service"] == "worker"
    assert all(v >= 0 for series in found.values() for _, v in series)

    assert await stop(proc) == 0
    events = json_lines(path)
    library = [e for e in events if e.get("logger") == "tests.library"]
    assert [e["event"] for e in library] == ["library says hello"], library
    assert library[0]["job_id"] == blocked.job_id  # contextvars reach library lines too
    finished = [e for e in events if e["event"] == "job.finished"]
    assert [e["tenant"] for e in finished] == ["acme"], finished


async def test_dispatcher_serves_liveness_and_build_info(
    redis_server: RedisServer, spawn_service: SpawnService
) -> None:
    port = free_port()
    proc = spawn_service("dispatcher", redis_server.url, SPLATQ_METRICS_PORT=str(port))
    path = log_path(proc)

    async def alive() -> bool:
        return await reachable_status(f"http://127.0.0.1:{port}/livez") == 200

    await eventually(alive, timeout=60, interval=0.1)
    _, text = await http_get(f"http://127.0.0.1:{port}/metrics")
    assert samples(text)["splatq_build_info"][0][0]["service"] == "dispatcher"
    assert await stop(proc) == 0
    assert json_lines(path)


async def test_gateway_logs_only_json_and_says_where_it_listens(
    redis_server: RedisServer, spawn_service: SpawnService
) -> None:
    port, metrics_port = free_port(), free_port()
    proc = spawn_service(
        "gateway",
        redis_server.url,
        SPLATQ_GATEWAY_PORT=str(port),
        SPLATQ_METRICS_PORT=str(metrics_port),
        SPLATQ_GATEWAY_HOST="127.0.0.1",
        SPLATQ_API_KEYS="acme:sq_test_key",
        SPLATQ_LOG_LEVEL="debug",
        PYTHONASYNCIODEBUG="1",  # asyncio and aiohttp write their debug lines
    )
    path = log_path(proc)

    async def listening() -> bool:
        return b"gateway.listening" in path.read_bytes()

    await eventually(listening, timeout=60, interval=0.1)
    # A request aiohttp refuses before any handler runs: aiohttp logs it, not splatq.
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        raw.sendall(b"NOT-HTTP \x00\x01\r\n\r\n")
        raw.recv(4096)
    status, text = await http_get(f"http://127.0.0.1:{metrics_port}/metrics")
    assert status == 200
    status, _ = await http_get(f"http://127.0.0.1:{port}/metrics")
    assert status == 404  # the API port does not serve it once the metrics port does
    assert await stop(proc) == 0

    events = json_lines(path)
    started = next(e for e in events if e["event"] == "gateway.listening")
    assert (started["host"], started["port"]) == ("127.0.0.1", port)
    assert started["service"] == "gateway"
    loggers = {e.get("logger") for e in events}
    assert "asyncio" in loggers, loggers
    assert any(str(name).startswith("aiohttp") for name in loggers), loggers

    # The gateway's /metrics: the queue gauges and build info, no empty worker families,
    # no -1 sentinel.
    found = samples(text)
    assert found["splatq_build_info"][0][0]["service"] == "gateway"
    assert "splatq_oldest_waiting_age_seconds" in text
    for worker_family in ("splatq_deliveries", "splatq_job_queue_wait_duration_seconds"):
        assert worker_family not in text
    assert all(v >= 0 for series in found.values() for _, v in series)


async def test_a_crash_is_one_json_event(
    redis_server: RedisServer, spawn_service: SpawnService
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = spawn_service(
            "gateway",
            redis_server.url,
            SPLATQ_GATEWAY_PORT=str(port),
            SPLATQ_GATEWAY_HOST="127.0.0.1",
            SPLATQ_API_KEYS="acme:sq_test_key",
        )
        path = log_path(proc)

        async def exited() -> bool:
            return proc.poll() is not None

        await eventually(exited, timeout=60, interval=0.1)
    assert proc.returncode != 0
    events = json_lines(path)
    crash = [e for e in events if e["event"] == "process.crashed"]
    assert len(crash) == 1, events
    assert "OSError" in crash[0]["exception"], crash
    assert "address already in use" in crash[0]["exception"].lower(), crash
