"""Whole-process fixtures: worker subprocesses (`splatq worker`) that tests kill; thin
wrappers over `splatq.shared.testing.ServiceProcesses`."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator

import pytest

from splatq.shared.testing import ServiceProcesses
from tests.helpers import REPO_ROOT
from tests.vendor.conftest import fake_vendor  # noqa: F401 - the remote fleet tests' vendor

SpawnWorker = Callable[..., subprocess.Popen[bytes]]


@pytest.fixture
def spawn_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SpawnWorker]:
    """Start `python -m splatq.services.cli worker --handler tests.handlers:make`; all are
    killed after the test. Logs go to a file per process (shown on failure by the asserts)."""
    procs = ServiceProcesses(tmp_path_factory.mktemp("worker-logs"), cwd=REPO_ROOT)

    def spawn(
        redis_url: str, handler: str = "tests.handlers:make", **overrides: str
    ) -> subprocess.Popen[bytes]:
        return procs.start_worker(redis_url, handler, **overrides)

    yield spawn
    procs.kill_all()


SpawnService = Callable[..., subprocess.Popen[bytes]]


@pytest.fixture
def spawn_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SpawnService]:
    """Start `python -m splatq.services.cli <command>` with the test environment plus overrides;
    every one is killed after the test."""
    procs = ServiceProcesses(tmp_path_factory.mktemp("service-logs"), cwd=REPO_ROOT)

    def spawn(command: str, redis_url: str, **overrides: str) -> subprocess.Popen[bytes]:
        return procs.start_service(command, redis_url, **overrides)

    yield spawn
    procs.kill_all()
