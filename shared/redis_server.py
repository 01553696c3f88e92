"""Runs a `redis-server` child process: the embedded Redis of `splatq up`, tests and benches.

Process management only (start, stop, kill, restart); it never touches splatq's keys.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError


class RedisServerError(RuntimeError):
    """redis-server is missing or did not come up."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def redis_server_binary() -> str:
    path = shutil.which("redis-server")
    if path is None:
        raise RedisServerError(
            "redis-server not found on PATH: install it (Debian: apt-get install redis-server)"
            " or set SPLATQ_REDIS_URL to an existing Redis"
        )
    return path


@dataclass
class RedisServer:
    """One redis-server on 127.0.0.1:`port` with its data (AOF) under `data_dir`."""

    data_dir: Path
    port: int = field(default_factory=free_port)
    appendonly: bool = True
    # `always`: every write is fsynced before the reply (what durability tests use);
    # `everysec`: the production default, up to ~1 s lost on a host crash.
    appendfsync: str = "everysec"
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _argv(self) -> list[str]:
        return [
            redis_server_binary(),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.data_dir.resolve()),
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", self.appendfsync,
            "--protected-mode", "no",
            "--daemonize", "no",
            "--logfile", str((self.data_dir / "redis.log").resolve()),
        ]  # fmt: skip

    async def start(self, timeout_s: float = 15.0) -> None:
        """Start and wait until it answers PING with its data loaded."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(  # noqa: ASYNC220 - returns at once; we poll below
            self._argv(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        client = Redis.from_url(self.url)
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout_s
            while True:
                if self.process.poll() is not None:
                    raise RedisServerError(
                        f"redis-server exited with {self.process.returncode}; see "
                        f"{self.data_dir / 'redis.log'}"
                    )
                try:
                    if await client.ping():  # type: ignore[misc]
                        return
                except (RedisConnectionError, ResponseError):
                    # ResponseError: LOADING while the AOF is replayed
                    pass
                if loop.time() > deadline:
                    raise RedisServerError(f"redis-server on {self.port} did not start")
                await asyncio.sleep(0.02)
        finally:
            await client.aclose()

    async def stop(self, timeout_s: float = 15.0) -> None:
        """Graceful: SIGTERM makes redis-server flush the AOF and exit."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        await self._wait(timeout_s)

    async def kill(self) -> None:
        """SIGKILL: what a crash looks like (AOF keeps what was fsynced)."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.kill()
        await self._wait(10.0)

    async def restart(self) -> None:
        await self.stop()
        await self.start()

    async def _wait(self, timeout_s: float) -> None:
        assert self.process is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.process.poll() is None:
            if loop.time() > deadline:
                with contextlib.suppress(ProcessLookupError):
                    self.process.kill()
            await asyncio.sleep(0.02)
