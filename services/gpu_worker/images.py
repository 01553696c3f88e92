"""Decoding a job's input image into the model's square RGBA tensor.

Pure (bytes in, tensor out); corrupt or hostile input raises a PermanentError with a code.
"""

from __future__ import annotations

import dataclasses
import io

import numpy as np
import torch
from PIL import Image

from splatq.shared.engine.errors import PermanentError
from splatq.shared.images.headers import (
    IMAGE_TOO_COMPLEX,
    IMAGE_TOO_LARGE,
    JPEG,
    DecodeLimits,
    HeaderRejected,
    ImageHeader,
    check_limits,
    read_header,
)

MAX_INPUT_PIXELS = 40_000_000  # matches the gateway's decompression-bomb limit


class InvalidImage(PermanentError):
    code = "INVALID_IMAGE"


class ImageTooLarge(PermanentError):
    code = "IMAGE_TOO_LARGE"


class ImageTooComplex(PermanentError):
    code = "IMAGE_TOO_COMPLEX"


_ERRORS: dict[str, type[PermanentError]] = {
    IMAGE_TOO_LARGE: ImageTooLarge,
    IMAGE_TOO_COMPLEX: ImageTooComplex,
}


def check_input(data: bytes, resolution: int, limits: DecodeLimits) -> ImageHeader:
    """The gateway's pre-decode gate, again: an input stored before a limit was lowered, or
    written to storage by anything but the gateway, must not cost this worker a bomb's CPU or
    memory. JPEG decodes at the draft scale that still covers `resolution`."""
    try:
        header = read_header(data, limits.max_jpeg_scans)
        if header.format is JPEG:
            header = dataclasses.replace(header, decode_scale=_draft_scale(header, resolution))
        check_limits(header, limits)
    except HeaderRejected as exc:
        raise _ERRORS.get(exc.code, InvalidImage)(exc.detail) from None
    return header


def _draft_scale(header: ImageHeader, resolution: int) -> int:
    """The largest JPEG DCT scale (8, 4, 2, 1) that keeps the long side >= `resolution`."""
    long_side = max(header.width, header.height)
    return next((s for s in (8, 4, 2) if long_side // s >= resolution), 1)


def decode_image(data: bytes, resolution: int, limits: DecodeLimits | None = None) -> torch.Tensor:
    """[4, R, R] float32 RGBA in [0, 1]: fitted into the square, aspect kept, padded with
    transparency (or with the border colour when the image has no alpha, so background
    segmentation by border colour still works). Nothing is decoded before `check_input`
    passes; a refused input raises a PermanentError with its code."""
    header = check_input(data, resolution, limits or DecodeLimits(max_pixels=MAX_INPUT_PIXELS))
    # No warnings.catch_warnings() here: it swaps process-wide filters and decodes run in
    # several threads at once. The header checks above bound memory instead.
    try:
        with Image.open(io.BytesIO(data), formats=list(header.format.pillow)) as probe:
            if probe.size != (header.width, header.height):
                raise InvalidImage(
                    f"the header says {header.width}x{header.height}, not {probe.size}"
                )
            if header.format is JPEG and header.decode_scale > 1:
                dct = header.decode_scale
                probe.draft(probe.mode, (probe.width // dct, probe.height // dct))
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
