"""`splatq up` as a benchmark's child process, and a submission's form: what the benchmarks that
drive the whole stack as an operator runs it (bench/stack_flood.py, bench/soak.py) share.

Only ports and the data directory are chosen here (plus whatever the caller adds to the
environment); every other setting is `splatq up`'s default, so the figures are the defaults'.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import orjson

from splatq.shared.redis.server import free_port

UP_TIMEOUT_S = 300.0
BANNER = b"splatq is up"


@dataclass(frozen=True)
class UpStack:
    """A running `splatq up` and what a client needs of it."""

    proc: subprocess.Popen[bytes]
    base: str  # the gateway's URL
    api_key: str  # the development key `splatq up` made ('' with SPLATQ_API_KEYS given)
    redis_url: str  # its embedded redis-server


@contextlib.asynccontextmanager
async def splatq_up(tmp: Path, env: Mapping[str, str] | None = None) -> AsyncIterator[UpStack]:
    """`splatq up` in `tmp` (its own data dir, free ports, no SPLATQ_ variable of this
    process), with `env` on top, until it printed its banner; stopped with SIGTERM (SIGKILL
    past a minute) after. Its output goes to `tmp/up.log`, drained all the while: a full pipe
    would block the stack."""
    port, redis_port = free_port(), free_port()
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("SPLATQ_")}
    full_env.update(
        SPLATQ_DATA_DIR=str(tmp / "data"),
        SPLATQ_GATEWAY_PORT=str(port),
        SPLATQ_EMBEDDED_REDIS_PORT=str(redis_port),
        **(env or {}),
    )
    log = (tmp / "up.log").open("ab")
    proc = subprocess.Popen(  # noqa: ASYNC220 - returns at once; the banner is read below
        [sys.executable, "-m", "splatq.services.cli", "up"],
        cwd=tmp,
        env=full_env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=log,
    )
    try:
        await _wait_for_banner(proc, log)
        threading.Thread(target=log.writelines, args=(proc.stdout,), daemon=True).start()
        dev_key = tmp / "data" / "dev-api-key"  # made unless the caller gave SPLATQ_API_KEYS
        key = dev_key.read_text(encoding="utf-8").strip() if dev_key.exists() else ""
        yield UpStack(proc, f"http://127.0.0.1:{port}", key, f"redis://127.0.0.1:{redis_port}")
    finally:
        if proc.poll() is None:
            proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


async def _wait_for_banner(proc: subprocess.Popen[bytes], log: io.BufferedWriter) -> None:
    assert proc.stdout is not None
    stdout = proc.stdout
    deadline = time.monotonic() + UP_TIMEOUT_S
    loop = asyncio.get_running_loop()
    while True:
        remaining = deadline - time.monotonic()
        line = await asyncio.wait_for(loop.run_in_executor(None, stdout.readline), remaining)
        if not line:
            raise RuntimeError(f"splatq up exited ({proc.wait()}); see its up.log")
        log.write(line)
        if BANNER in line:
            return


def job_form(
    quality: str, image: bytes, api_key: str, wait_s: int = 0
) -> tuple[aiohttp.FormData, dict[str, str]]:
    """A submission's multipart body (a PNG, the cache off) and headers (`Prefer: wait` when
    `wait_s`)."""
    form = aiohttp.FormData(default_to_multipart=True)
    form.add_field("image", image, filename="in.png", content_type="image/png")
    form.add_field(
        "params",
        orjson.dumps({"quality": quality, "cache": False}).decode(),
        content_type="application/json",
    )
    headers = {"Authorization": f"Bearer {api_key}"}
    if wait_s:
        headers["Prefer"] = f"wait={wait_s}"
    return form, headers
