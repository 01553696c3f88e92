"""`make demo`: submit the bundled sample image to the running stack through the HTTP API,
show its progress, download the artifacts to ./out/ and verify them.

A client of the gateway only (the same calls `splatq submit --wait --out` makes).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import aiohttp

from splatq.services.gateway.local_viewer import write_local_viewer
from splatq.services.gpu_worker import formats, spz
from splatq.services.gpu_worker.artifacts import PREVIEW_MAX_SIZE
from splatq.shared.client import ApiProblem, Event, SplatqClient
from splatq.shared.settings import Settings
from splatq.shared.storage.store import ARTIFACT_FILES

SAMPLE = Path(__file__).resolve().parent / "samples" / "sample.png"
RESOLUTION = {"preview": 128, "full": 512}


async def run_demo(settings: Settings, out_dir: Path, quality: str = "preview") -> int:
    url = settings.public_base_url
    api_key = next(iter(settings.api_keys), "")
    if not await _wait_ready(url):
        print(f"demo: the gateway at {url} did not become ready", file=sys.stderr)
        return 1
    async with SplatqClient(url, api_key) as client:
        try:
            job = await client.submit(
                SAMPLE, quality=quality, cache=False, metadata={"source": "make demo"}
            )
            print(f"submitted {SAMPLE.name} as {job.id} ({quality})", flush=True)
            job = await client.wait(job.id, _show)
            if job.status != "completed":
                code, message = (job.error.code, job.error.message) if job.error else ("", "")
                print(f"job ended {job.status}: {code} {message}")
                return 1
            paths = {name: await client.download(job.id, name, out_dir) for name in ARTIFACT_FILES}
        except ApiProblem as exc:
            print(f"demo: {exc}", file=sys.stderr)
            return 1
    data = {name: await asyncio.to_thread(p.read_bytes) for name, p in paths.items()}
    ply = formats.verify_ply(data["gaussian_ply"])
    formats.verify_splat(data["splat"], expected_count=ply.count)
    spz.verify_spz(data["spz"], expected_count=ply.count)
    size = min(PREVIEW_MAX_SIZE, RESOLUTION[quality])
    formats.verify_png(data["rendered_preview"], size, size)
    print(
        f"verified: {ply.count} Gaussians; artifacts in {out_dir}/: "
        + ", ".join(ARTIFACT_FILES.values())
    )
    print(f"compute time {job.compute_time_ms} ms, model {job.model}")
    viewer = await asyncio.to_thread(write_local_viewer, out_dir, "scene.spz", data["spz"])
    print(f"open {viewer} in a browser to orbit the result")
    return 0


def _show(event: Event) -> None:
    data = event.data
    kind = event.name.rsplit(".", 1)[-1]
    extra = f" {float(data['progress']):4.0%} {data.get('stage', '')}" if "progress" in data else ""
    print(f"  {kind:<10}{extra}", flush=True)


async def _wait_ready(url: str, timeout_s: float = 60.0) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    async with aiohttp.ClientSession() as http:
        while loop.time() < deadline:
            try:
                async with http.get(f"{url}/readyz") as resp:
                    if resp.status == 200:
                        return True
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    return False
