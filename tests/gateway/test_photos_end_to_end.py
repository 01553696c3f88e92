"""Photos as people take them, through the gateway and a real worker: every EXIF
orientation comes out upright, HEIC and AVIF are accepted, a 48 MP phone JPEG completes, and
a HEIC bomb is refused with its code before any decoder runs."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pillow_heif
import pytest
from aiohttp.test_utils import TestClient
from PIL import Image

from bench.input_quality import heic_bytes, jpeg_bytes
from splatq.services.gpu_worker import formats
from splatq.services.gpu_worker.sample_photos import Scene, render_scene
from splatq.shared.engine.queue import JobQueue
from splatq.shared.images.orientation import apply
from splatq.shared.settings import Settings
from splatq.shared.testing import WorkerFactory, wait_for_status
from tests import hostile_inputs as hostile
from tests.gateway.conftest import AUTH_A
from tests.gateway.test_api import form, problem
from tests.helpers import GpuHandlerFactory

# Off-centre (a mirror moves the object) and taller than wide (a quarter turn shows).
SCENE = Scene("orient", "texture", width=200, height=150, cx=0.3, cy=0.45, object_height=0.6)
# What undoes each orientation: the stored pixels are the upright ones turned by this.
_STORED_BY = {1: 1, 2: 2, 3: 3, 4: 4, 5: 5, 6: 8, 7: 7, 8: 6}


def _stored_with(photo: Image.Image, orientation: int) -> bytes:
    """The upright photo stored as a camera held that way writes it, tagged `orientation`."""
    stored = apply(np.asarray(photo), _STORED_BY[orientation])
    exif = Image.Exif()
    exif[0x0112] = orientation
    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(stored)).save(
        buffer, "JPEG", quality=92, exif=exif.tobytes()
    )
    return buffer.getvalue()


async def _completed(client: TestClient[Any, Any], queue: JobQueue, data: bytes) -> dict[str, Any]:
    resp = await client.post("/v1/jobs", data=form(data, {"quality": "preview"}), headers=AUTH_A)
    assert resp.status == 202, await resp.text()
    job_id = (await resp.json())["id"]
    await wait_for_status(queue, job_id, {"completed", "failed"}, timeout=120)
    job: dict[str, Any] = await (await client.get(f"/v1/jobs/{job_id}", headers=AUTH_A)).json()
    assert job["status"] == "completed", job["error"]
    return job


async def _mask(client: TestClient[Any, Any], job: dict[str, Any]) -> np.ndarray:
    resp = await client.get(f"/v1/jobs/{job['id']}/artifacts/mask", headers=AUTH_A)
    assert (resp.status, resp.content_type) == (200, "image/png")
    data = await resp.read()
    formats.verify_png(data)
    return np.asarray(Image.open(io.BytesIO(data))) > 127


async def test_every_exif_orientation_is_reconstructed_upright(
    client: TestClient[Any, Any],
    queue: JobQueue,
    settings: Settings,
    start_worker: WorkerFactory,
    gpu_handler_factory: GpuHandlerFactory,
) -> None:
    """Orientations 1-8 of one photo: each job's mask (the object as the model got it) is of
    the upright photo and lies on the object, and its job says `segmented`."""
    photo, truth = render_scene(SCENE)
    check = _stored_with(photo, 6)
    assert apply(np.asarray(Image.open(io.BytesIO(check))), 6).shape[:2] == truth.shape
    await start_worker(await gpu_handler_factory(settings), worker_concurrency=4)
    for orientation in range(1, 9):
        job = await _completed(client, queue, _stored_with(photo, orientation))
        assert job["foreground"] == "segmented"
        mask = await _mask(client, job)
        assert mask.shape == truth.shape, orientation
        iou = (mask & truth).sum() / (mask | truth).sum()
        assert iou > 0.8, (orientation, iou)


async def test_heic_and_avif_photos_are_accepted_and_complete(
    client: TestClient[Any, Any],
    queue: JobQueue,
    settings: Settings,
    start_worker: WorkerFactory,
    gpu_handler_factory: GpuHandlerFactory,
) -> None:
    """An iPhone's format and AVIF: accepted (202), reconstructed, with a mask artifact."""
    photo, truth = render_scene(SCENE)
    buffer = io.BytesIO()
    photo.save(buffer, "AVIF", quality=85)
    await start_worker(await gpu_handler_factory(settings))
    for data in (heic_bytes(photo), buffer.getvalue()):
        job = await _completed(client, queue, data)
        assert set(job["artifacts"]) >= {"gaussian_ply", "splat", "rendered_preview", "mask"}
        mask = await _mask(client, job)
        assert (mask & truth).sum() / (mask | truth).sum() > 0.8


async def test_a_48_megapixel_phone_jpeg_completes(
    client: TestClient[Any, Any],
    queue: JobQueue,
    settings: Settings,
    start_worker: WorkerFactory,
    gpu_handler_factory: GpuHandlerFactory,
) -> None:
    """8064 x 6048, the main camera of current phones: under the default pixel limit, and
    decoded at a DCT scale, never whole."""
    photo, _ = render_scene(Scene("big", "gradient", width=1008, height=756, seed=2))
    data = jpeg_bytes(photo.resize((8064, 6048), Image.Resampling.BILINEAR), quality=80)
    assert len(data) < settings.max_upload_bytes
    await start_worker(await gpu_handler_factory(settings))
    job = await _completed(client, queue, data)
    mask = await _mask(client, job)
    assert max(mask.shape) == 1024  # the working size, from a 1/4-scale decode


async def test_a_heic_bomb_is_refused_with_its_code_before_decoding(
    client: TestClient[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real 64x48 HEIC whose ispe declares 60,000 x 60,000, and one whose grid names 10,000
    tiles: 422 image_too_large / image_too_complex, and no HEIF decoder was ever opened."""
    opened: list[object] = []
    real_open = pillow_heif.open_heif

    def spy(*args: Any, **kwargs: Any) -> Any:
        opened.append(args)
        return real_open(*args, **kwargs)

    monkeypatch.setattr(pillow_heif, "open_heif", spy)
    bomb = await client.post("/v1/jobs", data=form(hostile.heic_size_bomb()), headers=AUTH_A)
    body = await problem(bomb, 422, "image_too_large")
    assert "60000x60000" in body["detail"]
    grid = await client.post("/v1/jobs", data=form(hostile.heif_grid_bomb()), headers=AUTH_A)
    await problem(grid, 422, "image_too_complex")
    assert opened == []
    real = await client.post("/v1/jobs", data=form(hostile.heic_photo()), headers=AUTH_A)
    assert real.status == 202  # the control: a real HEIC does reach the decoder
    assert len(opened) == 1
