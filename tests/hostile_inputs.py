"""Hostile images, generated deterministically and in memory: JPEG scan bombs, pixel floods,
truncated headers, wrong magic and a size that disagrees with the data.

Test data only: builds bytes with Pillow and a few hand-written chunks, never opens a file.
"""

from __future__ import annotations

import functools
import io
import struct
import zlib

from PIL import Image

from tests.gateway.corpus import PNG_SIGNATURE, png_chunk


def _encode(image: Image.Image, fmt: str, **params: object) -> bytes:
    """The image saved in `fmt` to bytes."""
    buffer = io.BytesIO()
    image.save(buffer, fmt, **params)
    return buffer.getvalue()


def jpeg_markers(data: bytes) -> list[tuple[int, int]]:
    """(offset, marker) of every marker in a JPEG, entropy-coded data skipped (FF00 stuffing
    and RSTn are not markers). For building and checking test data; slow on purpose-free."""
    found = []
    i = 2
    while i < len(data) - 1:
        if data[i] == 0xFF and data[i + 1] not in (0x00, 0xFF) and not 0xD0 <= data[i + 1] <= 0xD7:
            found.append((i, data[i + 1]))
        i += 1
    return found


# -- JPEG scan bombs ----------------------------------------------------------------------


@functools.cache
def progressive_jpeg(side: int = 4000) -> bytes:
    """A valid progressive JPEG of a flat grey square: ten scans (libjpeg's simple
    progression), each tiny because every block's coefficients compress to end-of-band runs,
    yet each one walks every block of its component when decoded."""
    return _encode(Image.new("RGB", (side, side), (120, 130, 140)), "JPEG", progressive=True)


def _last_scan(data: bytes) -> tuple[int, int]:
    """[start, end) of the last scan with the table segments right before it (DHT...), so the
    repeated unit is self-contained; end is where EOI starts."""
    markers = jpeg_markers(data)
    if not markers or markers[-1][1] != 0xD9:
        raise ValueError("no EOI at the end of the JPEG")
    last_sos = max(i for i, (_, m) in enumerate(markers) if m == 0xDA)
    start = last_sos
    while start > 0 and markers[start - 1][1] in (0xC4, 0xDB, 0xDD):  # DHT, DQT, DRI
        start -= 1
    return markers[start][0], markers[-1][0]


def jpeg_scan_bomb(repeats: int = 1000, side: int = 4000) -> bytes:
    """A valid progressive JPEG whose last scan (an AC refinement pass over every block) is
    repeated `repeats` more times before EOI. libjpeg decodes every copy (warning, not
    failing, about the bogus progression): the work grows with `repeats` while the file
    grows by a few dozen bytes per copy."""
    data = progressive_jpeg(side)
    start, end = _last_scan(data)
    return data[:end] + data[start:end] * repeats + data[end:]


def jpeg_scan_count(data: bytes) -> int:
    """How many SOS markers (scans) a JPEG holds."""
    return sum(1 for _, m in jpeg_markers(data) if m == 0xDA)


# -- pixel floods -------------------------------------------------------------------------


def _ihdr(width: int, height: int, bit_depth: int = 8, colour_type: int = 0) -> bytes:
    """An IHDR chunk (compression, filter and interlace methods 0)."""
    return png_chunk(
        b"IHDR", struct.pack(">IIBBBBB", width, height, bit_depth, colour_type, 0, 0, 0)
    )


@functools.cache
def png_flood(side: int = 6324, colour_type: int = 6) -> bytes:
    """A complete, valid PNG of side x side 8-bit pixels, all zero, in one deflate stream:
    a few hundred kB that decode to side^2 x 4 bytes (RGBA, colour type 6). 6324^2 is just
    under the default 40,000,000-pixel limit, so only a memory-based bound refuses it."""
    channels = {0: 1, 2: 3, 4: 2, 6: 4}[colour_type]
    row = bytes(1 + side * channels)  # filter type 0, then the samples
    compressor = zlib.compressobj(9)
    parts = [compressor.compress(row * min(256, side - y)) for y in range(0, side, 256)]
    parts.append(compressor.flush())
    idat = png_chunk(b"IDAT", b"".join(parts))
    header = _ihdr(side, side, colour_type=colour_type)
    return PNG_SIGNATURE + header + idat + png_chunk(b"IEND", b"")


def png_header_flood(width: int = 100_000, height: int = 100_000) -> bytes:
    """A PNG whose IHDR declares width x height, followed by a tiny IDAT and IEND."""
    idat = png_chunk(b"IDAT", zlib.compress(b"\x00" * 16))
    return PNG_SIGNATURE + _ihdr(width, height) + idat + png_chunk(b"IEND", b"")


def jpeg_header_flood(width: int = 65_000, height: int = 65_000) -> bytes:
    """A small valid JPEG whose frame header (SOF) is rewritten to declare width x height."""
    data = bytearray(small_jpeg(progressive=True))
    sof = next(i for i, m in jpeg_markers(bytes(data)) if m in (0xC0, 0xC2))
    struct.pack_into(">HH", data, sof + 5, height, width)
    return bytes(data)


# -- broken headers -----------------------------------------------------------------------


def small_png(side: int = 16) -> bytes:
    """A valid side x side RGB PNG with a gradient."""
    image = Image.linear_gradient("L").resize((side, side)).convert("RGB")
    return _encode(image, "PNG")


def small_jpeg(side: int = 16, progressive: bool = False) -> bytes:
    """A valid side x side RGB JPEG with a gradient."""
    image = Image.linear_gradient("L").resize((side, side)).convert("RGB")
    return _encode(image, "JPEG", quality=90, progressive=progressive)


def truncated_headers() -> dict[str, bytes]:
    """Files cut inside their headers, before any size or frame is complete."""
    png, jpeg = small_png(), small_jpeg()
    sof = next(i for i, m in jpeg_markers(jpeg) if m == 0xC0)
    return {
        "png_signature_only": png[:8],
        "png_inside_ihdr": png[:20],
        "jpeg_soi_only": jpeg[:3],
        "jpeg_inside_sof": jpeg[: sof + 6],
        "jpeg_no_frame_before_scan": jpeg[:sof] + jpeg[jpeg.index(b"\xff\xda") :],
        "jpeg_segment_runs_past_end": jpeg[:sof] + b"\xff\xfe\xff\xf0" + b"x" * 8,
    }


def wrong_magic() -> dict[str, bytes]:
    """Image bodies behind the wrong (or no) signature."""
    png, jpeg = small_png(), small_jpeg()
    return {
        "png_body_jpeg_magic": b"\xff\xd8\xff" + png[8:],
        "jpeg_body_png_magic": PNG_SIGNATURE + jpeg[2:],
        "png_signature_corrupted": b"\x89PNX\r\n\x1a\n" + png[8:],
        "jpeg_without_soi": jpeg[2:],
    }


def png_size_disagrees_with_data(side: int = 64) -> bytes:
    """A PNG whose IHDR (correct CRC) declares twice the height its pixel data holds."""
    real = small_png(side)
    idat = real.index(b"IDAT") - 4
    return PNG_SIGNATURE + _ihdr(side, side * 2, colour_type=2) + real[idat:]


def jpeg_size_disagrees_with_data(side: int = 64) -> bytes:
    """A baseline JPEG whose SOF declares four times the height its scan holds data for."""
    data = bytearray(small_jpeg(side))
    sof = next(i for i, m in jpeg_markers(bytes(data)) if m == 0xC0)
    struct.pack_into(">H", data, sof + 5, side * 4)
    return bytes(data)
