"""The embedded redis-server of `splatq up` as real processes: it dies with a SIGKILLed
parent, and start-up refuses a foreign redis-server already answering on its port."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from splatq.services.stack import services_to_run
from splatq.shared.redis.server import RedisServer, RedisServerError, free_port
from splatq.shared.settings import Settings
from splatq.shared.testing import eventually
from tests.helpers import REPO_ROOT

pytestmark = pytest.mark.slow

# The embedded-redis start path on its own: start a RedisServer, say its pid, wait forever.
HOLDER = """
import asyncio, sys
from pathlib import Path
from splatq.shared.redis.server import RedisServer

async def main() -> None:
    server = RedisServer(Path(sys.argv[1]), port=int(sys.argv[2]))
    await server.start()
    print(server.process.pid, flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


def _gone(pid: int) -> bool:
    """No such process, or a zombie nobody has reaped yet (it holds no port and no files)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in {"Z", "X"}


def _stack_env(tmp_path: Path) -> dict[str, str]:
    """No SPLATQ_REDIS_URL (so `splatq up` embeds its Redis), nothing on fixed ports."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPLATQ_")}
    port = str(free_port())
    env.update(
        SPLATQ_GATEWAY_PORT=port,
        SPLATQ_GATEWAY_HOST="127.0.0.1",
        SPLATQ_PUBLIC_URL=f"http://127.0.0.1:{port}",
        SPLATQ_DATA_DIR=str(tmp_path / "var"),
        SPLATQ_LOG_FORMAT="json",
        SPLATQ_DEVICE="cpu",
        PYTHONUNBUFFERED="1",
    )
    return env


async def _server_pid(port: int, timeout_s: float = 30.0) -> int:
    """The pid of the redis-server answering on `port`, once one does."""
    client = Redis(port=port)
    pid = 0

    async def answers() -> bool:
        nonlocal pid
        try:
            pid = int((await client.info("server"))["process_id"])
        except RedisConnectionError:
            return False
        return True

    try:
        await eventually(answers, timeout=timeout_s, interval=0.05)
    finally:
        await client.aclose()
    return pid


async def _answers(port: int) -> bool:
    client = Redis(port=port)
    try:
        return bool(await client.ping())  # type: ignore[misc]
    except RedisConnectionError:
        return False
    finally:
        await client.aclose()


async def test_the_embedded_redis_dies_when_its_starter_is_sigkilled(tmp_path: Path) -> None:
    """A process that started a RedisServer is SIGKILLed: its redis-server exits too and the
    port is free again (before, it lived on in its own session, holding port and data)."""
    port = free_port()
    holder = subprocess.Popen(  # noqa: ASYNC220 - returns at once; readiness is polled
        [sys.executable, "-c", HOLDER, str(tmp_path / "redis"), str(port)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
    )
    redis_pid = 0
    try:
        redis_pid = await _server_pid(port)
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)

        async def redis_gone() -> bool:
            return _gone(redis_pid) and not await _answers(port)

        await eventually(redis_gone, timeout=15)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(timeout=10)
        if redis_pid and not _gone(redis_pid):
            os.kill(redis_pid, signal.SIGKILL)


async def test_splatq_up_sigkilled_takes_its_redis_and_services_with_it(tmp_path: Path) -> None:
    """`splatq up` SIGKILLed once its services are started: the embedded redis-server and
    every service process exit too, so the next `splatq up` finds the port free."""
    port = free_port()
    log_path = tmp_path / "up.log"
    with log_path.open("wb") as log:
        up = subprocess.Popen(  # noqa: ASYNC220 - returns at once; readiness is polled
            [sys.executable, "-m", "splatq.services.cli", "up", "--redis-port", str(port)],
            cwd=REPO_ROOT,
            env=_stack_env(tmp_path),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    pids: list[int] = []
    try:
        redis_pid = await _server_pid(port)

        async def services_started() -> bool:
            # every service of the stack (the quota settler joined the four in 9aa5e25)
            expected = len(services_to_run(Settings()))
            return log_path.read_text().count('"service.started"') == expected

        await eventually(services_started, timeout=30)
        children = [
            int(line.split('"pid":')[1].split(",")[0].split("}")[0])
            for line in log_path.read_text().splitlines()
            if '"service.started"' in line
        ]
        pids = [redis_pid, *children]
        up.send_signal(signal.SIGKILL)
        up.wait(timeout=10)

        async def all_gone() -> bool:
            return all(_gone(pid) for pid in pids) and not await _answers(port)

        await eventually(all_gone, timeout=30)
    finally:
        if up.poll() is None:
            up.kill()
            up.wait(timeout=10)
        for pid in pids:
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)


async def test_start_up_refuses_a_foreign_redis_on_its_port(tmp_path: Path) -> None:
    """Another redis-server (another directory's data) already answers on the port: starting
    the embedded one fails with a message naming that server, instead of silently using it
    while our own fails to bind; `splatq up` exits 1 with the message; the foreign server is
    left alone."""
    foreign = RedisServer(tmp_path / "foreign", appendonly=False)
    await foreign.start()
    try:
        ours = RedisServer(tmp_path / "ours", port=foreign.port)
        with pytest.raises(RedisServerError, match="already answered by another redis-server"):
            await ours.start()
        up = subprocess.run(  # noqa: ASYNC221 - a bounded, short-lived child
            [sys.executable, "-m", "splatq.services.cli", "up", "--redis-port", str(foreign.port)],
            cwd=REPO_ROOT,
            env=_stack_env(tmp_path),
            capture_output=True,
            timeout=60,
            check=False,
        )
        assert up.returncode == 1, up.stderr.decode()[-2000:]
        stderr = up.stderr.decode()
        assert "already answered by another redis-server" in stderr
        assert str((tmp_path / "foreign").resolve()) in stderr
        assert await _answers(foreign.port)
    finally:
        await foreign.stop()
