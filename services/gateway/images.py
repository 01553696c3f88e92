"""Validating an uploaded image before the gateway stores it and enqueues a job.

Pure validation, bytes in and a verdict out: it must do no I/O and change no Pillow global.
"""

from __future__ import annotations

import hashlib
import io
import struct
from dataclasses import dataclass
from typing import Literal

from PIL import (
    Image,
    ImageFile,
    JpegImagePlugin,  # noqa: F401 - registered at import, not lazily inside a worker thread
    PngImagePlugin,  # noqa: F401
    WebPImagePlugin,  # noqa: F401
)

RejectionCode = Literal["invalid_image", "image_too_large", "unsupported_media_type"]

INVALID_IMAGE: RejectionCode = "invalid_image"
IMAGE_TOO_LARGE: RejectionCode = "image_too_large"
UNSUPPORTED_MEDIA_TYPE: RejectionCode = "unsupported_media_type"

_STATUS: dict[str, int] = {INVALID_IMAGE: 422, IMAGE_TOO_LARGE: 422, UNSUPPORTED_MEDIA_TYPE: 415}

DEFAULT_MAX_PIXELS = 40_000_000
DEFAULT_MAX_SIDE = 16_384


class ImageRejected(Exception):
    """The upload is refused: `code` and `status` are the API contract's, `detail` is for humans."""

    code: RejectionCode
    status: int
    detail: str

    def __init__(self, code: RejectionCode, detail: str) -> None:
        if code not in _STATUS:
            raise ValueError(f"unknown rejection code {code!r}")
        super().__init__(code, detail)  # args match __init__, so the exception pickles
        self.code = code
        self.status = _STATUS[code]
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.code} ({self.status}): {self.detail}"


@dataclass(frozen=True)
class ValidatedImage:
    """An accepted upload. Width and height are as stored (before any EXIF orientation)."""

    mime: str
    extension: str  # without the dot, as `shared.storage.input_key` wants it
    width: int
    height: int
    has_alpha: bool
    sha256: str  # hex digest of the exact bytes received


@dataclass(frozen=True)
class _Format:
    name: str  # for messages
    mime: str
    extension: str
    pillow: tuple[str, ...]  # Pillow format names a file with this magic may decode as


_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_PNG = _Format("PNG", "image/png", "png", ("PNG",))
# A multi-picture JPEG (phone cameras' MPF, APP2) is still a baseline JPEG; Pillow calls it MPO.
_JPEG = _Format("JPEG", "image/jpeg", "jpg", ("JPEG", "MPO"))
_WEBP = _Format("WebP", "image/webp", "webp", ("WEBP",))

# Recognised only to say in the 415 what was sent; none of these is ever decoded.
_UNSUPPORTED_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"GIF87a", "GIF"),
    (b"GIF89a", "GIF"),
    (b"BM", "BMP"),
    (b"II*\x00", "TIFF"),
    (b"MM\x00*", "TIFF"),
    (b"%PDF-", "PDF"),
    (b"<?xml", "XML/SVG"),
    (b"<svg", "SVG"),
    (b"PK\x03\x04", "ZIP"),
)
_ISO_BMFF_BRANDS: dict[bytes, str] = {
    b"heic": "HEIC",
    b"heix": "HEIC",
    b"hevc": "HEIC",
    b"heim": "HEIC",
    b"heis": "HEIC",
    b"mif1": "HEIF",
    b"msf1": "HEIF",
    b"avif": "AVIF",
    b"avis": "AVIF",
}
# JPEG start-of-frame markers carry the size; C4 (DHT), C8 (JPG) and CC (DAC) are not frames.
_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_JPEG_STANDALONE = frozenset({0x01, *range(0xD0, 0xD8)})  # TEM, RSTn: no length field


def _sniff(data: bytes) -> _Format | None:
    if data.startswith(_PNG_MAGIC):
        return _PNG
    if data.startswith(b"\xff\xd8\xff"):
        return _JPEG
    if data.startswith(b"RIFF") and data[8:12] == b"WEBP":
        return _WEBP
    return None


def sniff_format(data: bytes) -> tuple[str, str] | None:
    """(mime, extension) when the magic bytes are PNG, JPEG or WebP; None otherwise."""
    fmt = _sniff(data)
    return None if fmt is None else (fmt.mime, fmt.extension)


def _describe_unsupported(data: bytes) -> str:
    if data[4:8] == b"ftyp" and (brand := _ISO_BMFF_BRANDS.get(data[8:12])):
        kind = brand
    else:
        head = data[:64].lstrip(b"\xef\xbb\xbf \t\r\n")  # SVG/XML may start with a BOM or space
        kind = next((name for magic, name in _UNSUPPORTED_MAGIC if head.startswith(magic)), "")
    what = f"{kind} files are" if kind else "this content is"
    return f"{what} not accepted; send a PNG, JPEG or WebP image"


def _png_header_size(data: bytes) -> tuple[int, int] | None:
    # The first chunk must be IHDR: length 13, then width and height as big-endian uint32.
    if len(data) < 24 or data[8:16] != b"\x00\x00\x00\x0dIHDR":
        return None
    width, height = struct.unpack_from(">II", data, 16)
    return int(width), int(height)


def _jpeg_header_size(data: bytes) -> tuple[int, int] | None:
    # Walk the marker segments up to the first start-of-frame; each step advances, so it ends.
    i = 2
    while i + 4 <= len(data):
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in _JPEG_STANDALONE:
            i += 2
            continue
        if marker in (0xD8, 0xD9, 0xDA):  # SOI again, EOI or scan data before any frame
            return None
        length = int.from_bytes(data[i + 2 : i + 4], "big")
        if length < 2:
            return None
        if marker in _JPEG_SOF:
            if i + 9 > len(data):
                return None
            height, width = struct.unpack_from(">HH", data, i + 5)
            return int(width), int(height)
        i += 2 + length
    return None


def _webp_header_size(data: bytes) -> tuple[int, int] | None:
    # Pillow's WebP decoder allocates the whole canvas while *opening*, so this check must come
    # first. Same fields as libwebp: VP8 (lossy) 14-bit sizes, VP8L 14-bit, VP8X 24-bit canvas.
    chunk = data[12:16]
    if chunk == b"VP8 " and len(data) >= 30 and data[23:26] == b"\x9d\x01\x2a":
        width, height = struct.unpack_from("<HH", data, 26)
        return width & 0x3FFF, height & 0x3FFF
    if chunk == b"VP8L" and len(data) >= 25 and data[20] == 0x2F:
        bits = int.from_bytes(data[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X" and len(data) >= 30:
        return int.from_bytes(data[24:27], "little") + 1, int.from_bytes(data[27:30], "little") + 1
    return None


def _header_size(data: bytes, fmt: _Format) -> tuple[int, int] | None:
    """The size the file declares, read without Pillow; None when the header is not readable
    (Pillow then gets to refuse the file itself)."""
    if fmt is _PNG:
        return _png_header_size(data)
    if fmt is _JPEG:
        return _jpeg_header_size(data)
    return _webp_header_size(data)


def _pixel_limit(max_pixels: int) -> int:
    # Pillow's own limit (MAX_IMAGE_PIXELS warns, twice that raises) still applies when it is
    # the stricter one; it is only read here, never changed.
    pillow_limit = Image.MAX_IMAGE_PIXELS
    return max_pixels if pillow_limit is None else min(max_pixels, pillow_limit)


def _check_size(fmt: _Format, size: tuple[int, int], limit: int, max_side: int) -> None:
    width, height = size
    if width <= 0 or height <= 0:
        raise ImageRejected(INVALID_IMAGE, f"the {fmt.name} image is {width}x{height} pixels")
    if width > max_side or height > max_side:
        raise ImageRejected(
            IMAGE_TOO_LARGE,
            f"the image is {width}x{height} pixels; each side may be at most {max_side}",
        )
    if width * height > limit:
        raise ImageRejected(
            IMAGE_TOO_LARGE,
            f"the image is {width}x{height} = {width * height} pixels; at most {limit} allowed",
        )


def validate_image(
    data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS, max_side: int = DEFAULT_MAX_SIDE
) -> ValidatedImage:
    """Accept a PNG, JPEG or WebP that decodes completely within the size limits, or raise
    ImageRejected (and nothing else, whatever the bytes). Synchronous and CPU-bound: the
    gateway runs it in a thread.

    The format comes from the magic bytes only; the declared size is checked before Pillow
    opens the file, again after, and only then is every pixel decoded, so truncation shows.
    Raises RuntimeError (a deployment bug, not a client error) if something in the process
    has set Pillow's LOAD_TRUNCATED_IMAGES, because truncated uploads would then pass.
    """
    if ImageFile.LOAD_TRUNCATED_IMAGES:
        raise RuntimeError(
            "PIL.ImageFile.LOAD_TRUNCATED_IMAGES is set in this process; "
            "the gateway cannot detect truncated uploads while it is"
        )
    if not data:
        raise ImageRejected(INVALID_IMAGE, "the upload is empty")
    fmt = _sniff(data)
    if fmt is None:
        raise ImageRejected(UNSUPPORTED_MEDIA_TYPE, _describe_unsupported(data))

    limit = _pixel_limit(max_pixels)
    declared = _header_size(data, fmt)
    if declared is not None:
        _check_size(fmt, declared, limit, max_side)

    broken = f"the {fmt.name} image cannot be decoded: it is truncated or corrupt"
    try:
        # `formats` keeps every other Pillow plugin away from these bytes.
        with Image.open(io.BytesIO(data), formats=list(fmt.pillow)) as image:
            if image.format not in fmt.pillow:
                raise ImageRejected(
                    INVALID_IMAGE,
                    f"the file starts like {fmt.name} but decodes as {image.format or 'unknown'}",
                )
            _check_size(fmt, image.size, limit, max_side)
            image.load()
            width, height = image.size
            has_alpha = image.has_transparency_data
    except ImageRejected:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        # The Warning arrives as an exception only where warnings are errors (python -W error).
        raise ImageRejected(
            IMAGE_TOO_LARGE, f"the image exceeds the pixel limit of {limit}"
        ) from exc
    except (OSError, ValueError, SyntaxError, struct.error, EOFError) as exc:
        # OSError includes PIL.UnidentifiedImageError and "image file is truncated".
        raise ImageRejected(INVALID_IMAGE, broken) from exc
    except Exception as exc:
        # Any other failure inside a decoder on hostile bytes is still the upload's fault.
        raise ImageRejected(INVALID_IMAGE, broken) from exc
    return ValidatedImage(
        mime=fmt.mime,
        extension=fmt.extension,
        width=width,
        height=height,
        has_alpha=has_alpha,
        sha256=hashlib.sha256(data).hexdigest(),
    )
