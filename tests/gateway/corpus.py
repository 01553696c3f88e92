"""The gateway's image corpus, generated in memory (no binary fixtures in the repository):
valid uploads, malformed ones, other formats, oversized headers, a bomb and polyglots."""

from __future__ import annotations

import functools
import io
import random
import struct
import zipfile
import zlib

import numpy as np
from PIL import Image

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
HTML_PAYLOAD = b"<!doctype html><html><body><script>alert(document.domain)</script></body></html>\n"


def _pixels(width: int, height: int, channels: int, seed: int = 7) -> Image.Image:
    """Noise over a gradient, so the encoders produce real entropy-coded data to cut into."""
    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 255, width * height * channels).reshape(height, width, channels)
    noise = rng.integers(0, 64, size=(height, width, channels))
    array = ((ramp + noise) % 256).astype(np.uint8)
    return Image.fromarray(array, "RGBA" if channels == 4 else "RGB")


def _encode(image: Image.Image, fmt: str, **params: object) -> bytes:
    """The image saved in `fmt` to bytes."""
    buffer = io.BytesIO()
    image.save(buffer, fmt, **params)
    return buffer.getvalue()


def png_chunk(kind: bytes, payload: bytes) -> bytes:
    """One PNG chunk: length, type, payload and the CRC over type and payload."""
    crc = zlib.crc32(kind + payload) & 0xFFFFFFFF
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", crc)


def _ihdr(width: int, height: int, bit_depth: int = 8, colour_type: int = 0) -> bytes:
    """An IHDR chunk (compression, filter and interlace methods 0)."""
    return png_chunk(
        b"IHDR", struct.pack(">IIBBBBB", width, height, bit_depth, colour_type, 0, 0, 0)
    )


def _zip_archive() -> bytes:
    """A small ZIP holding an HTML page with a script."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("index.html", HTML_PAYLOAD)
    return buffer.getvalue()


# -- valid uploads ------------------------------------------------------------------------


def valid_png(width: int = 64, height: int = 48, alpha: bool = False) -> bytes:
    """A valid RGB (or RGBA with alpha) PNG."""
    return _encode(_pixels(width, height, 4 if alpha else 3), "PNG")


def valid_jpeg(width: int = 64, height: int = 48) -> bytes:
    """A valid baseline RGB JPEG."""
    return _encode(_pixels(width, height, 3), "JPEG", quality=90)


def valid_webp(width: int = 64, height: int = 48, alpha: bool = False) -> bytes:
    """A valid lossy WebP (lossless when alpha is asked for, so the alpha survives)."""
    if alpha:
        return _encode(_pixels(width, height, 4), "WEBP", lossless=True)
    return _encode(_pixels(width, height, 3), "WEBP", quality=80)


def mpo_jpeg(width: int = 32, height: int = 24) -> bytes:
    """A two-picture MPO (what many phone cameras write): a baseline JPEG with an MPF index."""
    first, second = _pixels(width, height, 3, seed=1), _pixels(width, height, 3, seed=2)
    return _encode(first, "MPO", save_all=True, append_images=[second])


def png_with_appended_zip() -> bytes:
    """A complete valid PNG followed by a ZIP archive after IEND (the classic PNG/ZIP polyglot)."""
    return valid_png() + _zip_archive()


# -- malformed uploads --------------------------------------------------------------------


def empty() -> bytes:
    """Zero bytes."""
    return b""


def random_bytes(n: int = 4096, seed: int = 0) -> bytes:
    """`n` pseudo-random bytes, reproducible by seed (no image magic, with overwhelming odds)."""
    return random.Random(seed).randbytes(n)


def truncated_png() -> bytes:
    """A valid PNG cut in the middle of its IDAT data (IEND and the rest of the pixels gone)."""
    data = valid_png(128, 96)
    idat = data.index(b"IDAT")
    (length,) = struct.unpack_from(">I", data, idat - 4)
    return data[: idat + 4 + length // 2]


def truncated_jpeg() -> bytes:
    """A valid JPEG cut halfway through its entropy-coded scan (no EOI)."""
    data = valid_jpeg(128, 96)
    scan = data.index(b"\xff\xda")
    return data[: scan + (len(data) - scan) // 2]


def zero_width_png() -> bytes:
    """A structurally complete PNG whose IHDR declares a width of 0."""
    idat = png_chunk(b"IDAT", zlib.compress(b"\x00" * 10))
    return PNG_SIGNATURE + _ihdr(0, 10) + idat + png_chunk(b"IEND", b"")


def jpeg_magic_png_body() -> bytes:
    """JPEG magic (FF D8 FF) followed by a whole PNG: sniffed as JPEG, is not one."""
    return b"\xff\xd8\xff" + valid_png()


def polyglot() -> bytes:
    """PNG signature followed by a ZIP archive (index.html with a script) instead of chunks.

    It sniffs as PNG, and a ZIP reader that scans for the central directory from the end
    opens it; it is no PNG: there is no IHDR after the signature."""
    return PNG_SIGNATURE + _zip_archive()


def gif_js_polyglot() -> bytes:
    """A 1x1 GIF that is also JavaScript: `GIF89a/*...*/=alert(1);` (the header opens a comment)."""
    # Logical screen width is the two bytes "/*" (10799 px), so the header opens a JS comment;
    # then height 1, no global colour table, and after the GIF trailer the comment is closed.
    header = b"GIF89a/*\x01\x00\x00\x00\x00"
    image = b",\x00\x00\x00\x00\x01\x00\x01\x00\x00\x02\x02D\x01\x00;"
    return header + image + b"*/=alert(1);"


# -- other formats ------------------------------------------------------------------------


def gif_1x1() -> bytes:
    """A valid 1x1 GIF."""
    return _encode(Image.new("P", (1, 1)), "GIF")


def bmp_1x1() -> bytes:
    """A valid 1x1 BMP."""
    return _encode(Image.new("RGB", (1, 1)), "BMP")


def tiff_1x1() -> bytes:
    """A valid 1x1 TIFF."""
    return _encode(Image.new("RGB", (1, 1)), "TIFF")


def pdf_1x1() -> bytes:
    """A one-page PDF holding a 1x1 image."""
    return _encode(Image.new("RGB", (1, 1)), "PDF")


def svg() -> bytes:
    """An SVG document (XML declaration, then an svg element with a script)."""
    return (
        b'<?xml version="1.0" encoding="UTF-8"?>\n'
        b'<svg xmlns="http://www.w3.org/2000/svg" width="1" height="1">'
        b"<script>alert(1)</script></svg>\n"
    )


def heic_header() -> bytes:
    """The start of a HEIC file: an ISO-BMFF `ftyp` box with the `heic` brand, then zeros
    (no meta box: no image in it)."""
    ftyp = b"ftypheic" + b"\x00\x00\x00\x00" + b"mif1heic"
    return struct.pack(">I", 4 + len(ftyp)) + ftyp + b"\x00" * 32


def mp4_header() -> bytes:
    """The start of an MP4 video: an ISO-BMFF `ftyp` box with the `isom` brand."""
    ftyp = b"ftypisom" + b"\x00\x00\x02\x00" + b"isomiso2mp41"
    return struct.pack(">I", 4 + len(ftyp)) + ftyp + b"\x00" * 32


# -- oversized ----------------------------------------------------------------------------


def huge_png_header(width: int = 30_000, height: int = 30_000) -> bytes:
    """A valid signature and IHDR (correct CRC) declaring width x height, a tiny IDAT, IEND."""
    idat = png_chunk(b"IDAT", zlib.compress(b"\x00" * 16))
    return PNG_SIGNATURE + _ihdr(width, height) + idat + png_chunk(b"IEND", b"")


def huge_jpeg_header(width: int = 30_000, height: int = 30_000) -> bytes:
    """A valid small JPEG whose SOF0 frame header is rewritten to declare width x height."""
    data = bytearray(valid_jpeg(16, 16))
    sof = data.index(b"\xff\xc0")
    struct.pack_into(">HH", data, sof + 5, height, width)
    return bytes(data)


def _riff_chunk(kind: bytes, payload: bytes) -> bytes:
    """One RIFF chunk: FourCC, little-endian size, payload padded to an even length."""
    return kind + struct.pack("<I", len(payload)) + payload + b"\x00" * (len(payload) % 2)


def huge_webp_header(width: int = 12_000, height: int = 12_000) -> bytes:
    """A valid animated WebP (VP8X + ANIM) with a width x height canvas and one 1x1 frame.

    About 90 bytes. 12000x12000 is under Pillow's own bomb error (2 x 89.5 MP); Pillow opens
    it, and loading it fills the whole canvas (measured: over 2 GB and seconds)."""
    frame = _encode(Image.new("RGBA", (1, 1), (255, 0, 0, 255)), "WEBP", lossless=True)[12:]
    vp8x = bytes([0x02, 0, 0, 0])  # flags: animation
    vp8x += (width - 1).to_bytes(3, "little") + (height - 1).to_bytes(3, "little")
    anim = struct.pack("<IH", 0, 0)  # background colour, loop count
    # ANMF: x/2, y/2, width-1, height-1, duration (24-bit each), flags; then the VP8L chunk.
    anmf = bytes(12) + (100).to_bytes(3, "little") + b"\x00" + frame
    body = b"WEBP" + _riff_chunk(b"VP8X", vp8x) + _riff_chunk(b"ANIM", anim)
    body += _riff_chunk(b"ANMF", anmf)
    return b"RIFF" + struct.pack("<I", len(body)) + body


@functools.cache
def bomb_png(width: int = 20_000, height: int = 20_000) -> bytes:
    """A real decompression bomb: 1-bit greyscale, every row zeros, one deflate stream.

    20000x20000 compresses to about 50 kB; Pillow would decode it to 400 MB (mode "1")."""
    row = bytes(1 + (width + 7) // 8)  # filter type 0, then the packed bits
    compressor = zlib.compressobj(9)
    rows_per_step = 1024
    parts = []
    for start in range(0, height, rows_per_step):
        parts.append(compressor.compress(row * min(rows_per_step, height - start)))
    parts.append(compressor.flush())
    idat = png_chunk(b"IDAT", b"".join(parts))
    return PNG_SIGNATURE + _ihdr(width, height, bit_depth=1) + idat + png_chunk(b"IEND", b"")
