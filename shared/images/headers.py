"""What an uploaded image declares (format, size, JPEG scans, decoded bytes), read from its
structure without decoding: the checks the gateway and the GPU worker run before any decoder.

Pure and bounded: bytes in, a header or a coded refusal out; no Pillow, no allocation that
grows with the pixels, and every walk stops at a fixed structure limit.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from splatq.shared.images import exif, isobmff
from splatq.shared.images.codes import (
    IMAGE_TOO_COMPLEX,
    IMAGE_TOO_LARGE,
    INVALID_IMAGE,
    UNSUPPORTED_MEDIA_TYPE,
    HeaderCode,
    HeaderRejected,
)
from splatq.shared.images.orientation import from_transforms, upright_size

if TYPE_CHECKING:
    from splatq.shared.settings import Settings

__all__ = [
    "IMAGE_TOO_COMPLEX",
    "IMAGE_TOO_LARGE",
    "INVALID_IMAGE",
    "UNSUPPORTED_MEDIA_TYPE",
    "HeaderCode",
    "HeaderRejected",
]

# Every scan of a progressive JPEG walks every block of its components again, and libjpeg
# decodes repeated scans (it only warns about the bogus progression), so the decoding work is
# pixels x scans: a 150 kB file can cost ten seconds. libjpeg's own progressions use at most
# 10 scans (jpeg_simple_progression); 32 leaves room for hand-tuned encoders.
DEFAULT_MAX_JPEG_SCANS = 32
# Pillow walks JPEG segments before the first scan, and PNG chunks outside IDAT, in Python:
# millions of tiny COM or tEXt entries cost seconds. Real files have a few dozen segments, and
# PNG encoders split IDAT into >= 8 kB chunks (a 20 MB upload: under 3,000 chunks).
MAX_JPEG_SEGMENTS = 1_000
MAX_PNG_CHUNKS = 65_536
MAX_WEBP_CHUNKS = 65_536
# What phones produce: 48 and 50 MP main cameras (8064x6048, 8160x6120), 64 MP ones
# (9248x6936); only a JPEG's DCT-scaled decode makes such a photo cheap (JPEG_DRAFT_SCALE).
DEFAULT_MAX_PIXELS = 80_000_000
DEFAULT_MAX_SIDE = 16_384
# What one decoded image may take in memory. Pillow holds RGB and RGBA at 4 bytes a pixel,
# so the pixel limit alone lets a few-hundred-kB PNG of 8900x8900 take 302 MiB (refused:
# over this).
# A HEIC decodes whole (no scaled decode) and peaks at ~6 bytes a pixel: 300 MiB admits a
# 50 MP one (286 MiB).
DEFAULT_MAX_DECODE_BYTES = 300 * 1024 * 1024
# A HEIC's peak while decoding, in decoded images: libheif's planes and the RGB image.
HEIF_PEAK_FACTOR = 2
# JPEG decoders can scale by 1/2, 1/4 or 1/8 while decoding (the DCT does it for free).
JPEG_DRAFT_SCALE = 8


@dataclass(frozen=True)
class ImageFormat:
    name: str  # for messages
    mime: str
    extension: str  # without the dot, as `splatq.shared.storage.store.input_key` wants it
    pillow: tuple[str, ...]  # Pillow format names a file with this magic may decode as


PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PNG = ImageFormat("PNG", "image/png", "png", ("PNG",))
# A multi-picture JPEG (phone cameras' MPF, APP2) is still a baseline JPEG; Pillow calls it MPO.
JPEG = ImageFormat("JPEG", "image/jpeg", "jpg", ("JPEG", "MPO"))
WEBP = ImageFormat("WebP", "image/webp", "webp", ("WEBP",))
# HEIF/HEIC (HEVC) decodes through pillow-heif, AVIF (AV1) through Pillow's own plugin.
HEIF = ImageFormat("HEIF", "image/heic", "heic", ("HEIF",))
AVIF = ImageFormat("AVIF", "image/avif", "avif", ("AVIF",))
_FAMILIES = {"HEIF": HEIF, "AVIF": AVIF}


@dataclass(frozen=True)
class DecodeLimits:
    """The bounds a decode must fit before it starts (from SPLATQ_MAX_IMAGE_PIXELS,
    SPLATQ_MAX_DECODE_BYTES and SPLATQ_MAX_JPEG_SCANS)."""

    max_pixels: int = DEFAULT_MAX_PIXELS
    max_side: int = DEFAULT_MAX_SIDE
    max_decode_bytes: int = DEFAULT_MAX_DECODE_BYTES
    max_jpeg_scans: int = DEFAULT_MAX_JPEG_SCANS

    @classmethod
    def from_settings(cls, settings: Settings) -> DecodeLimits:
        return cls(
            max_pixels=settings.max_image_pixels,
            max_decode_bytes=settings.max_decode_bytes,
            max_jpeg_scans=settings.max_jpeg_scans,
        )


@dataclass(frozen=True)
class ImageHeader:
    """What the file declares. `width` x `height` is what its decoder returns; `orientation`
    (EXIF 1-8) what turns that upright, applied once after decoding (pillow-heif applies a
    HEIC's irot/imir itself: 1 there, the size already turned). `scans` is 1 but for JPEG;
    `decode_scale` is the JPEG draft scale the byte estimate assumes (1 for the others)."""

    format: ImageFormat
    width: int
    height: int
    scans: int = 1
    bytes_per_pixel: int = 4
    decode_scale: int = 1
    orientation: int = 1

    @property
    def pixels(self) -> int:
        return self.width * self.height

    @property
    def upright_size(self) -> tuple[int, int]:
        """(width, height) of the picture as it is meant to be seen."""
        return upright_size(self.width, self.height, self.orientation)

    @property
    def decode_bytes(self) -> int:
        """Bytes the decoded image takes in Pillow, at the decode scale."""
        scale = self.decode_scale
        return -(-self.width // scale) * -(-self.height // scale) * self.bytes_per_pixel


def sniff(data: bytes) -> ImageFormat | None:
    """The format the magic bytes name, when it is PNG, JPEG, WebP, HEIF/HEIC or AVIF."""
    if data.startswith(PNG_MAGIC):
        return PNG
    if data.startswith(b"\xff\xd8\xff"):
        return JPEG
    if data.startswith(b"RIFF") and data[8:12] == b"WEBP":
        return WEBP
    family = isobmff.brand_family(data)
    return None if family is None else _FAMILIES[family]


def read_header(data: bytes, max_jpeg_scans: int = DEFAULT_MAX_JPEG_SCANS) -> ImageHeader:
    """The declared size, orientation (and JPEG scan count) of a PNG, JPEG, WebP, HEIF/HEIC
    or AVIF, or HeaderRejected: unsupported_media_type without one of their magics,
    invalid_image when the header is unreadable (no decoder ever sees such a file),
    image_too_complex past a structure limit. Linear in the bytes, with a constant number of
    Python steps per segment, chunk or box."""
    fmt = sniff(data)
    if fmt is None:
        raise HeaderRejected(
            UNSUPPORTED_MEDIA_TYPE, "not a PNG, JPEG, WebP, HEIF/HEIC or AVIF image"
        )
    if fmt is PNG:
        return _png_header(data)
    if fmt is JPEG:
        return _jpeg_header(data, max_jpeg_scans)
    if fmt is WEBP:
        return _webp_header(data)
    return _isobmff_header(data, fmt)


def check_limits(header: ImageHeader, limits: DecodeLimits) -> None:
    """image_too_large / image_too_complex / invalid_image for a header outside the limits,
    judged on the upright picture (the orientation applied first)."""
    width, height = header.upright_size
    name = header.format.name
    if width <= 0 or height <= 0:
        raise HeaderRejected(INVALID_IMAGE, f"the {name} image is {width}x{height} pixels")
    if header.scans > limits.max_jpeg_scans:
        raise HeaderRejected(IMAGE_TOO_COMPLEX, _too_many_scans(limits.max_jpeg_scans))
    side = limits.max_side
    if width > side or height > side:
        raise HeaderRejected(
            IMAGE_TOO_LARGE,
            f"the image is {width}x{height} pixels; each side may be at most {side}",
        )
    if header.pixels > limits.max_pixels:
        raise HeaderRejected(
            IMAGE_TOO_LARGE,
            f"the image is {width}x{height} = {header.pixels} pixels; "
            f"at most {limits.max_pixels} allowed",
        )
    if header.decode_bytes > limits.max_decode_bytes:
        raise HeaderRejected(
            IMAGE_TOO_LARGE,
            f"the {width}x{height} {name} image decodes to {header.decode_bytes} bytes; "
            f"at most {limits.max_decode_bytes} allowed",
        )


def inspect_image(data: bytes, limits: DecodeLimits) -> ImageHeader:
    """read_header then check_limits: the whole pre-decode gate."""
    header = read_header(data, limits.max_jpeg_scans)
    check_limits(header, limits)
    return header


def _too_many_scans(limit: int) -> str:
    return f"the JPEG has more than {limit} scans; re-encode it (baseline, or standard progressive)"


def _unreadable(fmt: ImageFormat, what: str) -> HeaderRejected:
    return HeaderRejected(INVALID_IMAGE, f"the {fmt.name} header is unreadable: {what}")


# -- PNG ----------------------------------------------------------------------------------

# Bytes a pixel takes in Pillow's decoded mode, by (colour type, bit depth): "1", "L" and "P"
# are one byte; RGB, RGBA, LA and 16-bit grey are counted as four (an upper bound).
_PNG_BYTES_PER_PIXEL = {(0, 8): 1, (0, 4): 1, (0, 2): 1, (0, 1): 1, (3, 8): 1}
_PNG_VALID_DEPTHS = {0: {1, 2, 4, 8, 16}, 2: {8, 16}, 3: {1, 2, 4, 8}, 4: {8, 16}, 6: {8, 16}}


def _png_header(data: bytes) -> ImageHeader:
    # The first chunk must be IHDR: length 13, width, height, depth, colour type...
    if len(data) < 33 or data[8:16] != b"\x00\x00\x00\x0dIHDR":
        raise _unreadable(PNG, "it does not start with a complete IHDR chunk")
    width, height, depth, colour = struct.unpack_from(">IIBB", data, 16)
    if depth not in _PNG_VALID_DEPTHS.get(colour, ()):
        raise _unreadable(PNG, f"bit depth {depth} with colour type {colour}")
    orientation = 1
    # Counts the chunks (past MAX_PNG_CHUNKS is image_too_complex); eXIf holds the EXIF.
    for kind, start, end in png_chunks(data):
        if kind == b"eXIf" and orientation == 1:
            orientation = exif.orientation(data[start:end])
    bpp = _PNG_BYTES_PER_PIXEL.get((colour, depth), 4)
    return ImageHeader(PNG, int(width), int(height), bytes_per_pixel=bpp, orientation=orientation)


def png_chunks(data: bytes) -> Iterator[tuple[bytes, int, int]]:
    """(type, payload start, payload end) of each PNG chunk up to IEND, from lengths alone
    (no CRC); a chunk running past the end is cut there, for the decoder to report. Raises
    image_too_complex past MAX_PNG_CHUNKS."""
    offset, chunks = 8, 0
    while offset + 8 <= len(data):
        chunks += 1
        if chunks > MAX_PNG_CHUNKS:
            raise HeaderRejected(IMAGE_TOO_COMPLEX, f"the PNG has over {MAX_PNG_CHUNKS} chunks")
        (length,) = struct.unpack_from(">I", data, offset)
        kind = data[offset + 4 : offset + 8]
        yield kind, offset + 8, min(offset + 8 + length, len(data))
        if kind == b"IEND":
            return
        offset += 12 + length


# -- JPEG ---------------------------------------------------------------------------------

# Start-of-frame markers carry the size; C4 (DHT), C8 (JPG) and CC (DAC) are not frames.
_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_JPEG_STANDALONE = frozenset({0x01, *range(0xD0, 0xD8)})  # TEM, RSTn: no length field
_SOS, _EOI, _SOI, _APP1 = 0xDA, 0xD9, 0xD8, 0xE1
# The next marker after entropy-coded data: FF then anything but a stuffed 00, a restart
# marker or another FF (fill). A regex, so skipping megabytes of scan data runs in C.
_NEXT_MARKER = re.compile(rb"\xff[^\x00\xd0-\xd7\xff]")


def _jpeg_header(data: bytes, max_scans: int) -> ImageHeader:
    """Walks every segment up to the first EOI (an MPO's later pictures are never decoded):
    the frame header gives the size, each SOS is one scan to decode."""
    size: tuple[int, int] | None = None
    scans = segments = 0
    orientation = 0  # 0: no EXIF block seen yet (the first one counts)
    i = 2
    while i + 2 <= len(data):
        if data[i] != 0xFF:
            raise _unreadable(JPEG, f"no marker at byte {i}")
        marker = data[i + 1]
        if marker == _EOI:
            break
        if marker == 0xFF or marker in _JPEG_STANDALONE:  # a fill byte, TEM or RSTn
            i += 1 if marker == 0xFF else 2
            continue
        segments += 1
        end = _segment_end(data, i, segments)
        if marker in _JPEG_SOF and size is None:
            if end - i < 9:
                raise _unreadable(JPEG, "the frame header is too short")
            height, width = struct.unpack_from(">HH", data, i + 5)
            size = (int(width), int(height))
        elif marker == _APP1 and not orientation and data.startswith(exif.EXIF_PREFIX, i + 4):
            orientation = exif.orientation(data[i + 4 : end])
        i = end
        if marker == _SOS:
            if size is None:
                raise _unreadable(JPEG, "a scan comes before the frame header")
            scans += 1
            if scans > max_scans:
                raise HeaderRejected(IMAGE_TOO_COMPLEX, _too_many_scans(max_scans))
            found = _NEXT_MARKER.search(data, i)
            if found is None:
                break  # truncated scan data: the decoder reports it
            i = found.start()
    if size is None:
        raise _unreadable(JPEG, "no frame header (SOF)")
    width, height = size
    return ImageHeader(
        JPEG,
        width,
        height,
        scans=scans,
        decode_scale=JPEG_DRAFT_SCALE,
        orientation=orientation or 1,
    )


def _segment_end(data: bytes, i: int, segments: int) -> int:
    """Where the segment whose marker is at `i` ends, checking the structure limits."""
    marker = data[i + 1]
    if marker == _SOI or i + 4 > len(data):
        raise _unreadable(JPEG, f"marker {marker:#04x} at byte {i}")
    if segments > MAX_JPEG_SEGMENTS:
        raise HeaderRejected(IMAGE_TOO_COMPLEX, f"the JPEG has over {MAX_JPEG_SEGMENTS} segments")
    length = int.from_bytes(data[i + 2 : i + 4], "big")
    if length < 2 or i + 2 + length > len(data):
        raise _unreadable(JPEG, f"segment {marker:#04x} at byte {i} runs past the end")
    return i + 2 + length


# -- WebP ---------------------------------------------------------------------------------


def _webp_header(data: bytes) -> ImageHeader:
    # Pillow's WebP decoder allocates the whole canvas while *opening*, so this check must come
    # first. Same fields as libwebp: VP8 (lossy) 14-bit sizes, VP8L 14-bit, VP8X 24-bit canvas.
    chunk = data[12:16]
    if chunk == b"VP8 " and len(data) >= 30 and data[23:26] == b"\x9d\x01\x2a":
        width, height = struct.unpack_from("<HH", data, 26)
        return ImageHeader(WEBP, width & 0x3FFF, height & 0x3FFF)
    if chunk == b"VP8L" and len(data) >= 25 and data[20] == 0x2F:
        bits = int.from_bytes(data[21:25], "little")
        return ImageHeader(WEBP, (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1)
    if chunk == b"VP8X" and len(data) >= 30:
        width = int.from_bytes(data[24:27], "little") + 1
        height = int.from_bytes(data[27:30], "little") + 1
        # Only the extended format carries EXIF (flag bit 3), in a chunk after the image's.
        orientation = _webp_orientation(data) if data[20] & 0x08 else 1
        return ImageHeader(WEBP, width, height, orientation=orientation)
    raise _unreadable(WEBP, "the first chunk is not a complete VP8, VP8L or VP8X header")


def _webp_orientation(data: bytes) -> int:
    """The EXIF chunk's orientation, walking the RIFF chunks by their lengths (bounded by
    MAX_WEBP_CHUNKS: an animation's frames are chunks too)."""
    offset, chunks = 12, 0
    while offset + 8 <= len(data):
        chunks += 1
        if chunks > MAX_WEBP_CHUNKS:
            raise HeaderRejected(IMAGE_TOO_COMPLEX, f"the WebP has over {MAX_WEBP_CHUNKS} chunks")
        kind = data[offset : offset + 4]
        length = int.from_bytes(data[offset + 4 : offset + 8], "little")
        if kind == b"EXIF":
            return exif.orientation(data[offset + 8 : offset + 8 + length])
        offset += 8 + length + (length & 1)  # chunks are padded to even lengths
    return 1


# -- HEIF/HEIC and AVIF -------------------------------------------------------------------


def _isobmff_header(data: bytes, fmt: ImageFormat) -> ImageHeader:
    """From the boxes (shared/images/isobmff.py). libheif turns a HEIC upright while
    decoding (its irot/imir; a HEIF's EXIF orientation is informative only), Pillow's AVIF
    decoder does not: there the transforms become the orientation to apply. The size is the
    coded one (`ispe`, or the grid's): what the decoder allocates; a clean aperture (clap)
    only makes the decoded picture smaller, which the decoders' callers accept."""
    layout = isobmff.read_layout(data)
    orientation = from_transforms(layout.transforms)
    bpp = 4 if layout.has_alpha or layout.bit_depth > 8 else 3
    if fmt is HEIF:
        width, height = upright_size(layout.width, layout.height, orientation)
        # libheif decodes the whole grid into its planes and converts them to the RGB image
        # Pillow then gets: both are alive at the peak, measured at ~6 bytes a pixel for an
        # 8-bit RGB HEIC (72 / 139 / 276 MiB at 12 / 24 / 48 MP, docs/benchmarks.md).
        return ImageHeader(HEIF, width, height, bytes_per_pixel=HEIF_PEAK_FACTOR * bpp)
    # Pillow holds every RGB(A) image at 4 bytes a pixel.
    return ImageHeader(AVIF, layout.width, layout.height, orientation=orientation)
