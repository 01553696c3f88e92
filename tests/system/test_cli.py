"""The whole stack as processes: a gateway and a GPU worker (CPU), driven by the `splatq`
CLI — what a user scripts against. Exit codes and --json output are part of the contract."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import orjson
import pytest

from splatq.services.gpu_worker import formats
from splatq.shared.redis.server import RedisServer, free_port
from splatq.shared.storage.store import LocalFileStorage
from splatq.shared.testing import service_env
from tests.gpu_worker.conftest import sample_png
from tests.helpers import REPO_ROOT
from tests.system.conftest import SpawnWorker

pytestmark = pytest.mark.slow
KEY = "cli-test-key"


@pytest.fixture
async def gateway_url(
    redis_server: RedisServer, storage: LocalFileStorage, tmp_path: Path
) -> AsyncIterator[str]:
    port = free_port()
    env = service_env(
        redis_server.url,
        SPLATQ_GATEWAY_PORT=str(port),
        SPLATQ_GATEWAY_HOST="127.0.0.1",
        SPLATQ_API_KEYS=f"acme:{KEY}",
        SPLATQ_STORAGE_URL=f"file://{storage.root}",
        SPLATQ_PUBLIC_URL=f"http://127.0.0.1:{port}",
    )
    log = (tmp_path / "gateway.log").open("wb")
    proc = subprocess.Popen(  # noqa: ASYNC220 - returns at once; readiness is polled below
        [sys.executable, "-m", "splatq.services.cli", "gateway"],
        cwd=REPO_ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(300):
                try:
                    async with http.get(f"{url}/readyz") as resp:
                        if resp.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        log.close()


async def splatq(*args: str, url: str, key: str = KEY) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "splatq.services.cli",
        *args,
        "--api-url",
        url,
        "--api-key",
        key,
        cwd=REPO_ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_submit_wait_download_status_and_exit_codes(
    gateway_url: str,
    redis_server: RedisServer,
    storage: LocalFileStorage,
    spawn_worker: SpawnWorker,
    tmp_path: Path,
) -> None:
    """`splatq submit --wait --out` exits 0 with whole artifacts; `status --json` reports the
    job; refusals exit 3 with the API's code; an unreachable API exits 4."""
    spawn_worker(
        redis_server.url,
        "splatq.services.gpu_worker.handler:make",
        SPLATQ_STORAGE_URL=f"file://{storage.root}",
        SPLATQ_DEVICE="cpu",
    )
    image = tmp_path / "figure.png"
    image.write_bytes(sample_png(5))
    out = tmp_path / "out"
    code, stdout, stderr = await splatq(
        "submit",
        str(image),
        "--quality",
        "preview",
        "--wait",
        "--out",
        str(out),
        "--json",
        url=gateway_url,
    )
    assert code == 0, stderr
    job = orjson.loads(stdout)
    assert job["status"] == "completed"
    count = formats.verify_ply((out / "scene.ply").read_bytes()).count
    assert formats.verify_splat((out / "scene.splat").read_bytes(), expected_count=count)
    formats.verify_png((out / "preview.png").read_bytes(), 128, 128)

    code, stdout, _ = await splatq("status", job["id"], "--json", url=gateway_url)
    assert code == 0
    assert orjson.loads(stdout)["id"] == job["id"]

    bad = tmp_path / "bad.png"
    bad.write_bytes(sample_png(5)[:100])
    code, stdout, _ = await splatq("submit", str(bad), "--json", url=gateway_url)
    assert code == 3
    assert orjson.loads(stdout)["error"]["code"] == "invalid_image"

    code, _, stderr = await splatq("status", job["id"], url=gateway_url, key="wrong")
    assert code == 3
    assert "unauthorized" in stderr

    code, _, _ = await splatq("status", job["id"], url=f"http://127.0.0.1:{free_port()}")
    assert code == 4
