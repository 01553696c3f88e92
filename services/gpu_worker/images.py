"""Decoding a job's input image: upright, at reduced scale, and (without stage 0) fitted into
the model's square RGBA tensor.

Pure (bytes in, pixels or tensor out); corrupt or hostile input raises a PermanentError with
a code.
"""

from __future__ import annotations

import dataclasses
import io
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from splatq.shared.errors import PermanentError
from splatq.shared.images import orientation
from splatq.shared.images.decoders import DecodedSizeMismatch, box_reduce, load_heif
from splatq.shared.images.headers import (
    DEFAULT_MAX_PIXELS,
    HEIF,
    IMAGE_TOO_COMPLEX,
    IMAGE_TOO_LARGE,
    JPEG,
    DecodeLimits,
    HeaderRejected,
    ImageHeader,
    check_limits,
    read_header,
)

MAX_INPUT_PIXELS = DEFAULT_MAX_PIXELS  # matches the gateway's decompression-bomb limit


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
    memory. JPEG decodes at the draft scale that still covers `resolution` (the long side)."""
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


@dataclass(frozen=True)
class Photo:
    """A decoded input, upright (its orientation applied once, here), at most `long_side`
    on its long side: [H, W, 4] uint8 RGBA (opaque where the file has no alpha)."""

    rgba: np.ndarray
    has_alpha: bool  # the file carries alpha (a cut-out only if some pixel is transparent)
    header: ImageHeader


def decode_photo(data: bytes, long_side: int, limits: DecodeLimits | None = None) -> Photo:
    """Decode at the smallest cost that still covers `long_side`: JPEG at a DCT draft scale,
    HEIF whole and box-filtered in strips (no second full-size copy), the others whole;
    then shrink (never enlarge) to `long_side` and turn upright. Nothing is decoded before
    `check_input` passes; a refused or corrupt input raises a PermanentError with its code."""
    header = check_input(data, long_side, limits or DecodeLimits(max_pixels=MAX_INPUT_PIXELS))
    # No warnings.catch_warnings() here: it swaps process-wide filters and decodes run in
    # several threads at once. The header checks above bound memory instead.
    try:
        if header.format is HEIF:
            pixels, has_alpha = load_heif(data, header)
            factor = max(1, max(pixels.shape[:2]) // long_side)
            image = Image.fromarray(np.ascontiguousarray(box_reduce(pixels, factor)))
        else:
            image, has_alpha = _decode_with_pillow(data, header)
    except (InvalidImage, DecodedSizeMismatch) as exc:
        raise InvalidImage(str(exc)) from None
    except Exception as exc:  # Pillow raises many types (OSError, SyntaxError, KeyError...)
        raise InvalidImage(f"cannot decode the input image: {exc}") from exc
    if image.width == 0 or image.height == 0:
        raise InvalidImage("the input image is empty")
    scale = long_side / max(image.width, image.height)
    if scale < 1.0:
        size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
        image = image.resize(size, Image.Resampling.LANCZOS)
    rgba = orientation.apply(np.asarray(image.convert("RGBA")), header.orientation)
    return Photo(np.ascontiguousarray(rgba), has_alpha, header)


def _decode_with_pillow(data: bytes, header: ImageHeader) -> tuple[Image.Image, bool]:
    with Image.open(io.BytesIO(data), formats=list(header.format.pillow)) as probe:
        if probe.size != (header.width, header.height):
            raise InvalidImage(f"the header says {header.width}x{header.height}, not {probe.size}")
        if header.format is JPEG and header.decode_scale > 1:
            dct = header.decode_scale
            probe.draft(probe.mode, (probe.width // dct, probe.height // dct))
        probe.load()
        has_alpha = probe.mode in {"RGBA", "LA", "PA"} or "transparency" in probe.info
        return probe.convert("RGBA"), has_alpha


def decode_image(data: bytes, resolution: int, limits: DecodeLimits | None = None) -> torch.Tensor:
    """[4, R, R] float32 RGBA in [0, 1]: the upright photo fitted into the square, aspect
    kept, padded with transparency (or with the border colour when the image has no alpha,
    so background segmentation by border colour still works). What the model gets with
    SPLATQ_FOREGROUND=none (no stage 0); a refused input raises a PermanentError."""
    photo = decode_photo(data, resolution, limits)
    image = Image.fromarray(photo.rgba)
    scale = resolution / max(image.width, image.height)
    size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
    resized = image.resize(size, Image.Resampling.LANCZOS)
    pad = (0, 0, 0, 0) if photo.has_alpha else border_colour(photo.rgba)
    canvas = Image.new("RGBA", (resolution, resolution), pad)
    canvas.paste(resized, ((resolution - size[0]) // 2, (resolution - size[1]) // 2))
    array = np.asarray(canvas, dtype=np.float32) / 255.0
    return torch.from_numpy(array).permute(2, 0, 1).contiguous()


def border_colour(rgba: np.ndarray) -> tuple[int, int, int, int]:
    """The opaque median colour of the outermost pixel ring of [H, W, 4] pixels."""
    border = np.concatenate([rgba[0], rgba[-1], rgba[:, 0], rgba[:, -1]])
    r, g, b, _ = (int(v) for v in np.median(border, axis=0))
    return (r, g, b, 255)
