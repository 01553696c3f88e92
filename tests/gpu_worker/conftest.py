"""Fixtures for the GPU worker: sample inputs in local storage, a CPU handler, jobs."""

from __future__ import annotations

import hashlib
import io

import numpy as np
from PIL import Image

from splatq.services.gpu_worker.samples import sample_image
from splatq.shared.engine.jobs import JobSpec
from splatq.shared.storage.store import Storage, input_key


def png_bytes(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def sample_png(seed: int) -> bytes:
    return png_bytes(sample_image(256, seed=seed))


def opaque_noise_png(size: int = 128, seed: int = 0) -> bytes:
    """No alpha and no uniform border: every pixel is foreground."""
    rng = np.random.default_rng(seed)
    return png_bytes(Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)))


async def stored_spec(storage: Storage, data: bytes, quality: str = "preview") -> JobSpec:
    digest = hashlib.sha256(data).hexdigest()
    key = input_key(digest, "png")
    await storage.put_bytes(key, data)
    return JobSpec(tenant="acme", quality=quality, input_ref=key, input_sha256=digest)
