"""Runs a `redis-server` child process: the embedded Redis of `splatq up`, tests and benches.

Process management only (start, stop, kill, restart); it never touches splatq's keys.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from splatq.shared.redis.tuning import tuning_arguments


class RedisServerError(RuntimeError):
    """redis-server is missing or did not come up."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def die_with_parent(sig: signal.Signals = signal.SIGTERM) -> Callable[[], None] | None:
    """A `preexec_fn` that has the kernel send `sig` to the child when the process that
    started it dies, even by SIGKILL (Linux only; None elsewhere). A child in its own
    session otherwise outlives a killed parent and keeps its ports."""
    if not sys.platform.startswith("linux"):
        return None
    parent = os.getpid()
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here, not in the forked child

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), sig)

    return preexec


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
            *tuning_arguments(),
        ]  # fmt: skip

    async def start(self, timeout_s: float = 15.0) -> None:
        """Start and wait until it answers PING with its data loaded. It dies with this
        process (its own session keeps it out of the terminal's Ctrl-C, so the caller can
        stop its clients first). Refuses (RedisServerError) to use another redis-server
        that already answers on the port: its data is not ours."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # PLW1509: the preexec only makes two syscalls (prctl, getppid), no locks or imports.
        self.process = subprocess.Popen(  # noqa: ASYNC220 - returns at once; we poll below
            self._argv(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True,
            preexec_fn=die_with_parent(),  # noqa: PLW1509
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
                        await self._check_it_is_ours(client)
                        return
                except (RedisConnectionError, ResponseError):
                    # ResponseError: LOADING while the AOF is replayed
                    pass
                if loop.time() > deadline:
                    raise RedisServerError(f"redis-server on {self.port} did not start")
                await asyncio.sleep(0.02)
        finally:
            await client.aclose()

    async def _check_it_is_ours(self, client: Redis) -> None:
        """The server answering on the port must be the process just started: an older
        redis-server left on it (say by a SIGKILLed `splatq up` elsewhere) would otherwise be
        used, with someone else's data, while ours fails to bind."""
        assert self.process is not None
        info = await client.info("server")
        if int(info.get("process_id", -1)) == self.process.pid:
            return
        config = await client.config_get("dir")
        self.process.kill()
        raise RedisServerError(
            f"port {self.port} is already answered by another redis-server (pid "
            f"{info.get('process_id')}, data in {config.get('dir', '?')}), not the one started "
            f"for {self.data_dir.resolve()}; stop that server or free the port (or set "
            "SPLATQ_REDIS_URL to use an existing Redis on purpose)"
        )

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
