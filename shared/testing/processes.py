"""splatq's own processes for whole-stack tests: `python -m splatq.services.cli <command>`
(a worker, the gateway, the dispatcher, ...) as children that a test can kill, each logging
to its own file, all SIGKILLed at the end."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from splatq.shared.settings.environ import environ_without_settings

# What `engine_settings` sets, as the environment of a child process.
FAST_ENV = {
    "SPLATQ_LEASE_TTL_MS": "900",
    "SPLATQ_REAPER_INTERVAL_MS": "200",
    "SPLATQ_RETRY_BASE_MS": "20",
    "SPLATQ_RETRY_CAP_MS": "100",
    "SPLATQ_WORKER_CONCURRENCY": "4",
    "SPLATQ_FETCH_BLOCK_MS": "100",
    "SPLATQ_MAX_DELIVERIES": "3",
    "SPLATQ_SHUTDOWN_GRACE_S": "3",
}


def service_env(redis_url: str, **overrides: str) -> dict[str, str]:
    """This process's environment without its `SPLATQ_*` variables, plus Redis at
    `redis_url`, short leases and intervals (as `engine_settings`), JSON logs, unbuffered
    output, then `overrides` (`SPLATQ_WORKER_CONCURRENCY="1"`, ...)."""
    env = environ_without_settings()
    env.update(
        {
            "SPLATQ_REDIS_URL": redis_url,
            **FAST_ENV,
            "SPLATQ_LOG_FORMAT": "json",
            "SPLATQ_LOG_LEVEL": "info",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(overrides)
    return env


class ServiceProcesses:
    """`python -m splatq.services.cli ...` children of one test, each logging to its own file
    under `log_dir` (stdout and stderr); `kill_all()` SIGKILLs those still running. `cwd`: the
    directory they start in (where `--handler mypkg.module:make` is importable from)."""

    def __init__(self, log_dir: Path, cwd: Path | None = None) -> None:
        self.log_dir = log_dir
        self.cwd = cwd
        self.procs: list[subprocess.Popen[bytes]] = []

    def log_path(self, index: int, args: list[str]) -> Path:
        return self.log_dir / f"{args[0]}-{index}.log"

    def start(self, args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        """`splatq <args>` with exactly `env` (see `service_env`)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path(len(self.procs), args), "wb")  # noqa: SIM115 - the child's
        proc = subprocess.Popen(
            [sys.executable, "-m", "splatq.services.cli", *args],
            cwd=self.cwd,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()  # the child holds its own copy
        self.procs.append(proc)
        return proc

    def start_worker(
        self, redis_url: str, handler: str, **overrides: str
    ) -> subprocess.Popen[bytes]:
        """`splatq worker --handler <module:factory>` on `redis_url` (see `service_env`)."""
        return self.start(["worker", "--handler", handler], service_env(redis_url, **overrides))

    def start_service(
        self, command: str, redis_url: str, **overrides: str
    ) -> subprocess.Popen[bytes]:
        """`splatq <command>` (`gateway`, `dispatcher`, `redriver`, ...) on `redis_url`."""
        return self.start([command], service_env(redis_url, **overrides))

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=10)
