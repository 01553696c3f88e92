"""The GPU worker's decode path on hostile inputs: the gateway's pre-decode gate applies
again, so a bomb fails its job permanently with a code instead of burning the worker's CPU."""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from typing import Any

import pytest
from PIL import Image

from splatq.services.gpu_worker.images import decode_image
from splatq.shared.engine.queue import JobQueue
from splatq.shared.errors import PermanentError
from splatq.shared.images.headers import DecodeLimits
from splatq.shared.settings import Settings
from splatq.shared.storage.store import LocalFileStorage
from splatq.shared.testing import WorkerFactory, wait_for_status
from tests import hostile_inputs as hostile
from tests.gpu_worker.conftest import stored_spec


def _gif() -> bytes:
    buffer = io.BytesIO()
    Image.new("P", (4, 4)).save(buffer, "GIF")
    return buffer.getvalue()


HOSTILE: list[tuple[str, Callable[[], bytes], str]] = [
    ("jpeg_scan_bomb", lambda: hostile.jpeg_scan_bomb(1000), "IMAGE_TOO_COMPLEX"),
    ("png_flood_8900", hostile.png_flood, "IMAGE_TOO_LARGE"),
    ("png_header_flood", hostile.png_header_flood, "IMAGE_TOO_LARGE"),
    ("jpeg_header_flood", hostile.jpeg_header_flood, "IMAGE_TOO_LARGE"),
    *(
        (name, lambda d=data: d, "INVALID_IMAGE")
        for name, data in {**hostile.truncated_headers(), **hostile.wrong_magic()}.items()
    ),
    ("gif_never_decoded", _gif, "INVALID_IMAGE"),
]


@pytest.mark.parametrize(
    ("factory", "code"), [pytest.param(f, c, id=name) for name, f, c in HOSTILE]
)
def test_hostile_input_raises_its_permanent_code_cheaply(
    factory: Callable[[], bytes], code: str
) -> None:
    """Each hostile input is a PermanentError with its code for under 50 ms of CPU (the scan
    bomb cost the worker ~10 s, the flood 302 MiB)."""
    data = factory()
    started = time.process_time()
    with pytest.raises(PermanentError) as info:
        decode_image(data, 128)
    assert time.process_time() - started < 0.05
    assert info.value.code == code


def test_worker_limits_come_from_its_settings() -> None:
    """The worker takes SPLATQ_MAX_JPEG_SCANS and SPLATQ_MAX_DECODE_BYTES from Settings."""
    bomb = hostile.jpeg_scan_bomb(22)  # 32 scans
    assert decode_image(bomb, 128).shape == (4, 128, 128)
    limits = DecodeLimits.from_settings(Settings().with_overrides(max_jpeg_scans=31))
    with pytest.raises(PermanentError) as info:
        decode_image(bomb, 128, limits)
    assert info.value.code == "IMAGE_TOO_COMPLEX"
    small = DecodeLimits.from_settings(Settings().with_overrides(max_decode_bytes=64 * 64 * 4))
    assert decode_image(hostile.small_png(64), 128, small).shape == (4, 128, 128)
    with pytest.raises(PermanentError) as info:
        decode_image(hostile.small_png(65), 128, small)
    assert info.value.code == "IMAGE_TOO_LARGE"


def test_jpeg_is_decoded_at_the_scale_the_resolution_needs() -> None:
    """A 4000x4000 JPEG fed to a 128 px model decodes at 1/8 scale (500x500, not 64 MB) and
    still fills the square."""
    started = time.process_time()
    tensor = decode_image(hostile.progressive_jpeg(), 128)
    assert time.process_time() - started < 0.5
    assert tensor.shape == (4, 128, 128)
    assert float(tensor[3].min()) == 1.0  # opaque: the whole square is the image


async def test_bomb_jobs_fail_once_with_their_codes(
    queue: JobQueue,
    settings: Settings,
    storage: LocalFileStorage,
    start_worker: WorkerFactory,
    gpu_handler_factory: Any,
) -> None:
    """End to end on a real worker and Redis: the scan bomb and the pixel flood each fail at
    their first attempt with their code, not retryable."""
    handler = await gpu_handler_factory(settings)
    bombs = {
        "IMAGE_TOO_COMPLEX": hostile.jpeg_scan_bomb(1000),
        "IMAGE_TOO_LARGE": hostile.png_flood(),
    }
    jobs = {
        code: await queue.enqueue(await stored_spec(storage, data)) for code, data in bombs.items()
    }
    await start_worker(handler)
    for code, job in jobs.items():
        failed = await wait_for_status(queue, job.job_id, {"failed"}, timeout=30)
        assert failed.error is not None
        assert (failed.error.code, failed.error.retryable, failed.attempts) == (code, False, 1)
