"""Decoding an image that passed the pre-decode gate: HEIF/HEIC through pillow-heif, read as
a numpy view of libheif's own buffer, and a strip-wise box filter that shrinks such a buffer
without a second full-size copy. PNG, JPEG, WebP and AVIF go through Pillow (callers).

No Pillow global changes: pillow-heif's opener is never registered.
"""

from __future__ import annotations

import io

import numpy as np
import pillow_heif

from splatq.shared.images.headers import ImageHeader

# Rows reduced per step: bounds the float temporary of `box_reduce` (~rows x width x 4 x 4 B).
_STRIP_ROWS = 256


class DecodedSizeMismatch(ValueError):
    """The decoder's size disagrees with the header the gate judged."""


def load_heif(data: bytes, header: ImageHeader) -> tuple[np.ndarray, bool]:
    """([H, W, 3 or 4] uint8 pixels, has alpha) of a HEIF/HEIC's primary image, decoded
    whole (HEVC has no scaled decode) and turned upright by libheif (irot/imir, clap). The
    array is a view of libheif's buffer: 3 or 4 bytes a pixel, the header's estimate.
    Raises DecodedSizeMismatch when the picture is larger than the header declared, and
    whatever pillow-heif raises on a corrupt file."""
    heif = pillow_heif.open_heif(io.BytesIO(data), convert_hdr_to_8bit=True)
    width, height = heif.size
    if width > header.width or height > header.height:
        raise DecodedSizeMismatch(
            f"the HEIF header says {header.width}x{header.height}, the decoder {width}x{height}"
        )
    pixels = np.asarray(heif)  # decodes
    return pixels, bool(heif.has_alpha)


def box_reduce(pixels: np.ndarray, factor: int) -> np.ndarray:
    """[H // f, W // f, C] uint8 mean of f x f blocks (the remainder rows and columns are
    dropped), computed in strips of rows so the temporary stays small."""
    if factor <= 1:
        return pixels
    height, width = (pixels.shape[0] // factor) * factor, (pixels.shape[1] // factor) * factor
    channels = pixels.shape[2]
    out = np.empty((height // factor, width // factor, channels), dtype=np.uint8)
    step = max(factor, (_STRIP_ROWS // factor) * factor)
    for y in range(0, height, step):
        strip = pixels[y : min(y + step, height), :width].astype(np.float32)
        blocks = strip.reshape(strip.shape[0] // factor, factor, width // factor, factor, channels)
        out[y // factor : (y + strip.shape[0]) // factor] = np.rint(blocks.mean(axis=(1, 3)))
    return out
