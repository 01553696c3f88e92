"""Whole-process fixtures: worker subprocesses (`splatq worker`) that tests kill."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.vendor.conftest import fake_vendor  # noqa: F401 - the remote fleet tests' vendor

SpawnWorker = Callable[..., subprocess.Popen[bytes]]


def worker_env(redis_url: str, **overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPLATQ_")}
    env.update(
        {
            "SPLATQ_REDIS_URL": redis_url,
            "SPLATQ_LEASE_TTL_MS": "900",
            "SPLATQ_REAPER_INTERVAL_MS": "200",
            "SPLATQ_RETRY_BASE_MS": "20",
            "SPLATQ_RETRY_CAP_MS": "100",
            "SPLATQ_WORKER_CONCURRENCY": "4",
            "SPLATQ_FETCH_BLOCK_MS": "100",
            "SPLATQ_MAX_DELIVERIES": "3",
            "SPLATQ_SHUTDOWN_GRACE_S": "3",
            "SPLATQ_LOG_FORMAT": "json",
            "SPLATQ_LOG_LEVEL": "info",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(overrides)
    return env


class _Processes:
    """`python -m splatq.services.cli ...` subprocesses of one test, each logging to its own file;
    all SIGKILLed at teardown."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        log = open(self.log_dir / f"{args[0]}-{len(self.procs)}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, "-m", "splatq.services.cli", *args],
            cwd=REPO_ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.procs.append(proc)
        return proc

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=10)


@pytest.fixture
def spawn_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SpawnWorker]:
    """Start `python -m splatq.services.cli worker --handler tests.handlers:make`; all are
    killed after the test. Logs go to a file per process (shown on failure by the asserts)."""
    procs = _Processes(tmp_path_factory.mktemp("worker-logs"))

    def spawn(
        redis_url: str, handler: str = "tests.handlers:make", **overrides: str
    ) -> subprocess.Popen[bytes]:
        return procs.start(["worker", "--handler", handler], worker_env(redis_url, **overrides))

    yield spawn
    procs.kill_all()


SpawnService = Callable[..., subprocess.Popen[bytes]]


@pytest.fixture
def spawn_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SpawnService]:
    """Start `python -m splatq.services.cli <command>` with the test environment plus overrides;
    every one is killed after the test."""
    procs = _Processes(tmp_path_factory.mktemp("service-logs"))

    def spawn(command: str, redis_url: str, **overrides: str) -> subprocess.Popen[bytes]:
        return procs.start([command], worker_env(redis_url, **overrides))

    yield spawn
    procs.kill_all()
