"""Validating an uploaded image before the gateway stores it and enqueues a job.

Pure validation, bytes in and a verdict out: it must do no I/O and change no Pillow global.
"""

from __future__ import annotations

import hashlib
import io
import struct
import zlib
from dataclasses import dataclass

from PIL import (
    AvifImagePlugin,  # noqa: F401 - registered at import, not lazily inside a worker thread
    Image,
    ImageFile,
    JpegImagePlugin,  # noqa: F401
    PngImagePlugin,  # noqa: F401
    WebPImagePlugin,  # noqa: F401
)

from splatq.shared.images.decoders import DecodedSizeMismatch, load_heif
from splatq.shared.images.headers import (
    DEFAULT_MAX_DECODE_BYTES,
    DEFAULT_MAX_JPEG_SCANS,
    DEFAULT_MAX_PIXELS,
    DEFAULT_MAX_SIDE,
    HEIF,
    IMAGE_TOO_COMPLEX,
    IMAGE_TOO_LARGE,
    INVALID_IMAGE,
    JPEG,
    PNG,
    UNSUPPORTED_MEDIA_TYPE,
    DecodeLimits,
    HeaderCode,
    HeaderRejected,
    ImageFormat,
    ImageHeader,
    check_limits,
    png_chunks,
    read_header,
    sniff,
)

RejectionCode = HeaderCode

_STATUS: dict[str, int] = {
    INVALID_IMAGE: 422,
    IMAGE_TOO_LARGE: 422,
    IMAGE_TOO_COMPLEX: 422,
    UNSUPPORTED_MEDIA_TYPE: 415,
}

__all__ = [
    "DEFAULT_MAX_DECODE_BYTES",
    "DEFAULT_MAX_JPEG_SCANS",
    "DEFAULT_MAX_PIXELS",
    "DEFAULT_MAX_SIDE",
    "INLINE_MAX_BYTES",
    "INLINE_MAX_PIXEL_SCANS",
    "ImageRejected",
    "ValidatedImage",
    "decode_limits",
    "decode_upload",
    "decodes_inline",
    "inspect_upload",
    "sniff_format",
    "validate_image",
]

# Uploads small enough to check and decode on the event loop itself: the hop to a decode
# thread and back costs more than their decode (see `decodes_inline`). The byte bound also
# bounds the header walk run inline (PNG chunks, JPEG segments).
INLINE_MAX_BYTES = 8 * 1024
INLINE_MAX_PIXEL_SCANS = 64 * 64


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
    """An accepted upload. Width and height are as decoded, before `orientation` (EXIF 1-8,
    read from the file's structure; the stored bytes keep it and the worker reads it again)."""

    mime: str
    extension: str  # without the dot, as `splatq.shared.storage.store.input_key` wants it
    width: int
    height: int
    has_alpha: bool
    sha256: str  # hex digest of the exact bytes received
    orientation: int = 1


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
ACCEPTED = "PNG, JPEG, WebP, HEIC/HEIF or AVIF"


def sniff_format(data: bytes) -> tuple[str, str] | None:
    """(mime, extension) when the magic bytes are an accepted format; None otherwise."""
    fmt = sniff(data)
    return None if fmt is None else (fmt.mime, fmt.extension)


def _describe_unsupported(data: bytes, detail: str) -> str:
    if sniff(data) is not None:
        return detail  # a HEIF/AVIF whose primary image is of another codec: the reader says
    if data[4:8] == b"ftyp":  # another ISO-BMFF file: MP4, MOV, JPEG 2000...
        return (
            "ISO-BMFF files other than HEIF/HEIC or AVIF still images are not accepted;"
            f" send a {ACCEPTED} image"
        )
    head = data[:64].lstrip(b"\xef\xbb\xbf \t\r\n")  # SVG/XML may start with a BOM or space
    kind = next((name for magic, name in _UNSUPPORTED_MAGIC if head.startswith(magic)), "")
    what = f"{kind} files are" if kind else "this content is"
    return f"{what} not accepted; send a {ACCEPTED} image"


def decode_limits(max_pixels: int, max_decode_bytes: int, max_jpeg_scans: int) -> DecodeLimits:
    """The gate's limits, the pixel limit lowered to Pillow's own when that is stricter."""
    return DecodeLimits(
        _pixel_limit(max_pixels), DEFAULT_MAX_SIDE, max_decode_bytes, max_jpeg_scans
    )


def _pixel_limit(max_pixels: int) -> int:
    # Pillow's own limit (MAX_IMAGE_PIXELS warns, twice that raises) still applies when it is
    # the stricter one; it is only read here, never changed.
    pillow_limit = Image.MAX_IMAGE_PIXELS
    return max_pixels if pillow_limit is None else min(max_pixels, pillow_limit)


# Adam7: (x start, y start, x step, y step) of the seven passes of an interlaced PNG.
_ADAM7: tuple[tuple[int, int, int, int], ...] = (
    (0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4),
    (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2),
)  # fmt: skip
_PNG_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}
_INFLATE_STEP = 1 << 20


def _png_raw_length(data: bytes) -> int:
    """Bytes the IHDR says the inflated IDAT stream holds: a filter byte per row, then the
    packed samples, for the whole image or for each of the seven Adam7 passes."""
    width, height, depth, colour, _, _, interlace = struct.unpack_from(">IIBBBBB", data, 16)
    bits = depth * _PNG_CHANNELS[colour]

    def rows(w: int, h: int) -> int:
        return 0 if w <= 0 or h <= 0 else h * (1 + (w * bits + 7) // 8)

    if not interlace:
        return rows(width, height)
    return sum(
        rows((width - x + dx - 1) // dx, (height - y + dy - 1) // dy) for x, y, dx, dy in _ADAM7
    )


def _check_png_data_length(data: bytes) -> None:
    """invalid_image when the pixel data holds fewer bytes than the header's size needs:
    Pillow fills the missing rows with zeros and calls the file whole. Inflates in 1 MiB
    steps, so memory stays flat whatever the size; corrupt streams are left to Pillow."""
    expected = _png_raw_length(data)
    inflater = zlib.decompressobj()
    produced = 0
    try:
        for kind, start, end in png_chunks(data):
            if kind != b"IDAT":
                continue
            pending = data[start:end]
            while pending and produced <= expected:
                produced += len(inflater.decompress(pending, _INFLATE_STEP))
                pending = inflater.unconsumed_tail
            if produced > expected or inflater.eof:
                break
    except zlib.error:
        return
    if produced < expected:
        raise ImageRejected(
            INVALID_IMAGE,
            f"the PNG's pixel data holds {produced} bytes; its header declares "
            f"{struct.unpack_from('>I', data, 16)[0]}x{struct.unpack_from('>I', data, 20)[0]} "
            f"pixels ({expected} bytes)",
        )


def _decode_completely(data: bytes, header: ImageHeader, limit: int) -> bool:
    """Decode every pixel (JPEG at 1/8 scale: the entropy-coded data is still read whole, so
    truncation shows; HEIC whole, through pillow-heif); True when the image has alpha."""
    fmt = header.format
    if fmt is HEIF:
        try:
            return load_heif(data, header)[1]
        except DecodedSizeMismatch as exc:
            raise ImageRejected(INVALID_IMAGE, str(exc)) from None
    # `formats` keeps every other Pillow plugin away from these bytes.
    with Image.open(io.BytesIO(data), formats=list(fmt.pillow)) as image:
        if image.format not in fmt.pillow:
            raise ImageRejected(
                INVALID_IMAGE,
                f"the file starts like {fmt.name} but decodes as {image.format or 'unknown'}",
            )
        if image.size != (header.width, header.height):
            raise ImageRejected(
                INVALID_IMAGE,
                f"the {fmt.name} header says {header.width}x{header.height}, "
                f"the decoder {image.width}x{image.height}",
            )
        if image.width * image.height > limit:  # Pillow's own limit, when it is stricter
            raise ImageRejected(IMAGE_TOO_LARGE, f"the image exceeds the pixel limit of {limit}")
        if fmt is JPEG:
            scale = header.decode_scale
            image.draft(image.mode, (max(1, image.width // scale), max(1, image.height // scale)))
        image.load()
        return bool(image.has_transparency_data)


def inspect_upload(data: bytes, limits: DecodeLimits) -> ImageHeader:
    """The pre-decode gate, run once per upload: magic, header, structure limits (JPEG
    scans and segments, PNG chunks), size and memory limits. No decoder runs and nothing is
    inflated, so its cost follows the bytes alone (the gateway runs it on the event loop for
    uploads up to INLINE_MAX_BYTES). Raises ImageRejected; RuntimeError when Pillow's
    LOAD_TRUNCATED_IMAGES is set, because truncated uploads would then pass."""
    if ImageFile.LOAD_TRUNCATED_IMAGES:
        raise RuntimeError(
            "PIL.ImageFile.LOAD_TRUNCATED_IMAGES is set in this process; "
            "the gateway cannot detect truncated uploads while it is"
        )
    if not data:
        raise ImageRejected(INVALID_IMAGE, "the upload is empty")
    try:
        header = read_header(data, limits.max_jpeg_scans)
        check_limits(header, limits)
    except HeaderRejected as exc:
        detail = (
            _describe_unsupported(data, exc.detail)
            if exc.code == UNSUPPORTED_MEDIA_TYPE
            else exc.detail
        )
        raise ImageRejected(exc.code, detail) from None
    return header


def decodes_inline(data: bytes, header: ImageHeader) -> bool:
    """True when decoding costs less than handing it to a decode thread (~100-140 us of CPU
    per hop on a 2-core VM, 2026-11-30): at most INLINE_MAX_BYTES, and pixels x scans at
    most INLINE_MAX_PIXEL_SCANS. Measured there: a 32x32 PNG 40-90 us, 64x64 ones up to
    ~230 us, the bound's worst case (WebP lossy or noise PNG at 64x64)."""
    return len(data) <= INLINE_MAX_BYTES and header.pixels * header.scans <= INLINE_MAX_PIXEL_SCANS


def decode_upload(data: bytes, header: ImageHeader, max_pixels: int) -> ValidatedImage:
    """Decode every pixel of an upload that passed `inspect_upload` (its `header`): a PNG's
    pixel data is first checked against its declared size, then the decoder runs, so
    truncation shows. Raises ImageRejected (and nothing else, whatever the bytes)."""
    fmt = header.format
    limit = _pixel_limit(max_pixels)
    if fmt is PNG:
        _check_png_data_length(data)
    try:
        has_alpha = _decode_completely(data, header, limit)
    except ImageRejected:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        # The Warning arrives as an exception only where warnings are errors (python -W error).
        raise ImageRejected(
            IMAGE_TOO_LARGE, f"the image exceeds the pixel limit of {limit}"
        ) from exc
    except (OSError, ValueError, SyntaxError, struct.error, EOFError) as exc:
        # OSError includes PIL.UnidentifiedImageError and "image file is truncated".
        raise ImageRejected(INVALID_IMAGE, _broken(fmt)) from exc
    except Exception as exc:
        # Any other failure inside a decoder on hostile bytes is still the upload's fault.
        raise ImageRejected(INVALID_IMAGE, _broken(fmt)) from exc
    return ValidatedImage(
        mime=fmt.mime,
        extension=fmt.extension,
        width=header.width,
        height=header.height,
        has_alpha=has_alpha,
        sha256=hashlib.sha256(data).hexdigest(),
        orientation=header.orientation,
    )


def _broken(fmt: ImageFormat) -> str:
    return f"the {fmt.name} image cannot be decoded: it is truncated or corrupt"


def validate_image(
    data: bytes,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    max_side: int = DEFAULT_MAX_SIDE,
    max_decode_bytes: int = DEFAULT_MAX_DECODE_BYTES,
    max_jpeg_scans: int = DEFAULT_MAX_JPEG_SCANS,
) -> ValidatedImage:
    """Accept a PNG, JPEG, WebP, HEIC/HEIF or AVIF that decodes completely within the
    limits (judged on the upright picture: EXIF orientation or HEIF transforms), or raise
    ImageRejected (and nothing else, whatever the bytes): `inspect_upload`, then
    `decode_upload`. Synchronous and CPU-bound: the gateway runs it in a thread, under
    `decode_slots`, unless the upload is small enough to inspect and decode inline.

    The format comes from the magic bytes only. Before any decoder runs, the structure is
    walked (`splatq.shared.images.headers`): the declared size against the pixel, side and memory
    limits, the JPEG scan count against `max_jpeg_scans`, a PNG's pixel data against its
    declared size, a HEIF/AVIF's items, tiles and extents (`splatq.shared.images.isobmff`).
    Only then is every pixel decoded, so truncation shows.
    """
    limits = DecodeLimits(_pixel_limit(max_pixels), max_side, max_decode_bytes, max_jpeg_scans)
    return decode_upload(data, inspect_upload(data, limits), max_pixels)
