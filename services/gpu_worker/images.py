"""Decoding a job's input image into the model's square RGBA tensor.

Pure (bytes in, tensor out); corrupt or hostile input raises a PermanentError with a code.
"""

from __future__ import annotations

import io

import numpy as np
import torch
from PIL import Image

from shared.errors import PermanentError

MAX_INPUT_PIXELS = 40_000_000  # matches the gateway's decompression-bomb limit


class InvalidImage(PermanentError):
    code = "INVALID_IMAGE"


def decode_image(data: bytes, resolution: int) -> torch.Tensor:
    """[4, R, R] float32 RGBA in [0, 1]: fitted into the square, aspect kept, padded with
    transparency (or with the border colour when the image has no alpha, so background
    segmentation by border colour still works)."""
    # No warnings.catch_warnings() here: it swaps process-wide filters and decodes run in
    # several threads at once. The explicit size check below bounds memory instead.
    try:
        with Image.open(io.BytesIO(data)) as probe:
            if probe.width * probe.height > MAX_INPUT_PIXELS:
                raise InvalidImage(f"image of {probe.width}x{probe.height} is too large")
            probe.load()
            has_alpha = probe.mode in {"RGBA", "LA", "PA"} or "transparency" in probe.info
            image = probe.convert("RGBA")
    except InvalidImage:
        raise
    except Exception as exc:  # Pillow raises many types (OSError, SyntaxError, KeyError...)
        raise InvalidImage(f"cannot decode the input image: {exc}") from exc
    if image.width == 0 or image.height == 0:
        raise InvalidImage("the input image is empty")
    scale = resolution / max(image.width, image.height)
    size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
    resized = image.resize(size, Image.Resampling.LANCZOS)
    pad = (0, 0, 0, 0) if has_alpha else _border_colour(image)
    canvas = Image.new("RGBA", (resolution, resolution), pad)
    canvas.paste(resized, ((resolution - size[0]) // 2, (resolution - size[1]) // 2))
    array = np.asarray(canvas, dtype=np.float32) / 255.0
    return torch.from_numpy(array).permute(2, 0, 1).contiguous()


def _border_colour(image: Image.Image) -> tuple[int, int, int, int]:
    a = np.asarray(image)
    border = np.concatenate([a[0], a[-1], a[:, 0], a[:, -1]])
    r, g, b, _ = (int(v) for v in np.median(border, axis=0))
    return (r, g, b, 255)
