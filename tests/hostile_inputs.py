"""Hostile images, generated deterministically and in memory: JPEG scan bombs, pixel floods,
truncated headers, wrong magic, a size that disagrees with the data, and HEIF/AVIF bombs
(declared sizes, item and tile floods, boxes and data past the end).

Test data only: builds bytes with Pillow and a few hand-written chunks, never opens a file.
"""

from __future__ import annotations

import functools
import io
import struct
import zlib

import numpy as np
import pillow_heif
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
def png_flood(side: int = 8900, colour_type: int = 6) -> bytes:
    """A complete, valid PNG of side x side 8-bit pixels, all zero, in one deflate stream:
    a few hundred kB that decode to side^2 x 4 bytes (RGBA, colour type 6). 8900^2 is just
    under the default 80,000,000-pixel limit and decodes to 302 MiB, just over the default
    300 MiB decode bound, so only that memory-based bound refuses it."""
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


# -- HEIF/HEIC and AVIF -------------------------------------------------------------------


@functools.cache
def heic_photo(width: int = 64, height: int = 48, tile_size: int = 0, seed: int = 0) -> bytes:
    """A real HEIC (pillow-heif's x265) of a gradient with noise; a grid of tiles when
    `tile_size` is set (as phones store large photos)."""
    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 255, width, dtype=np.float64)[None, :, None]
    pixels = np.clip(ramp + rng.normal(0, 8, (height, width, 3)), 0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    params: dict[str, object] = {"quality": 80}
    if tile_size:
        params["tile_size"] = tile_size
    pillow_heif.from_pillow(Image.fromarray(pixels)).save(buffer, **params)
    return buffer.getvalue()


def avif_photo(width: int = 64, height: int = 48) -> bytes:
    """A real AVIF (Pillow's own encoder) of a gradient."""
    image = Image.linear_gradient("L").resize((width, height)).convert("RGB")
    return _encode(image, "AVIF", quality=70)


def _with_ispe(data: bytes, width: int, height: int) -> bytes:
    """`data` with every `ispe` property rewritten to declare width x height."""
    out = bytearray(data)
    at = out.find(b"ispe")
    while at >= 0:
        struct.pack_into(">II", out, at + 8, width, height)  # after type, version/flags
        at = out.find(b"ispe", at + 4)
    return bytes(out)


def heic_size_bomb(side: int = 60_000) -> bytes:
    """A real 64x48 HEIC whose `ispe` declares side x side: a decoder trusting it allocates
    side^2 pixels (60,000^2 = 3.6 G). Refused from the boxes, before any decoder."""
    return _with_ispe(heic_photo(), side, side)


def avif_size_bomb(side: int = 60_000) -> bytes:
    """The same for AVIF."""
    return _with_ispe(avif_photo(), side, side)


def _box(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", 8 + len(payload)) + kind + payload


def _full_box(kind: bytes, payload: bytes, version: int = 0) -> bytes:
    return _box(kind, bytes([version, 0, 0, 0]) + payload)


def _heif(items: list[tuple[int, bytes]], refs: bytes, props: bytes, assoc: bytes) -> bytes:
    """A HEIF still: ftyp, then meta (hdlr pict, pitm 1, iinf, iref, iprp) and no data."""
    infos = b"".join(
        _full_box(b"infe", struct.pack(">HH", item, 0) + kind + b"\x00", version=2)
        for item, kind in items
    )
    meta = _full_box(
        b"meta",
        _full_box(b"hdlr", b"\x00" * 4 + b"pict" + b"\x00" * 13)
        + _full_box(b"pitm", struct.pack(">H", 1))
        + _full_box(b"iinf", struct.pack(">H", len(items)) + infos)
        + (_full_box(b"iref", refs) if refs else b"")
        + _box(b"iprp", _box(b"ipco", props) + _full_box(b"ipma", assoc)),
    )
    return _box(b"ftyp", b"heic\x00\x00\x00\x00mif1heic") + meta


def _ispe(width: int, height: int) -> bytes:
    return _full_box(b"ispe", struct.pack(">II", width, height))


def heif_item_flood(items: int = 5_000) -> bytes:
    """A HEIF declaring `items` image items (libheif walks every one while opening):
    ~100 kB for 5,000. Over the structure limit: image_too_complex."""
    listed = [(i, b"hvc1") for i in range(1, items + 1)]
    assoc = struct.pack(">IHBB", 1, 1, 1, 0x81)  # item 1 -> property 1 (ispe), essential
    return _heif(listed, b"", _ispe(64, 64), assoc)


def heif_grid_bomb(rows: int = 100, cols: int = 100) -> bytes:
    """A HEIF grid of rows x cols tiles that all name one tiny tile item: a few dozen kB
    whose decode runs the tile decoder rows x cols times. Past the tile limit:
    image_too_complex."""
    tiles = rows * cols
    refs = _box(b"dimg", struct.pack(">HH", 1, tiles) + struct.pack(">H", 2) * tiles)
    assoc = struct.pack(">I", 2) + struct.pack(">HBB", 1, 1, 0x81) + struct.pack(">HBB", 2, 1, 0x82)
    props = _ispe(64 * cols, 64 * rows) + _ispe(64, 64)
    return _heif([(1, b"grid"), (2, b"hvc1")], refs, props, assoc)


def heif_boxes_past_end() -> bytes:
    """A real HEIC whose meta box claims more bytes than the file holds."""
    data = bytearray(heic_photo())
    meta = data.index(b"meta") - 4
    struct.pack_into(">I", data, meta, len(data) * 2)
    return bytes(data)


def heif_truncated() -> bytes:
    """A real HEIC cut inside its coded data, its mdat box sized 0 ("to the end of the
    file", which is legal): only the item's location (iloc) shows the data is missing."""
    data = bytearray(heic_photo())
    mdat = data.index(b"mdat") - 4
    struct.pack_into(">I", data, mdat, 0)
    return bytes(data[: mdat + 48])
