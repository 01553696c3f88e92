"""The EXIF orientation tag (0x0112) read from a TIFF-structured EXIF block, without Pillow.

Pure and bounded: one IFD of at most MAX_IFD_ENTRIES entries is read; anything malformed
means "no orientation" (1), as browsers and Pillow treat a broken tag.
"""

from __future__ import annotations

import struct

ORIENTATION_TAG = 0x0112
# An EXIF block's first IFD holds a few dozen tags; a block of at most 64 kB (a JPEG APP1
# segment) cannot hold more than ~5,400 entries, so this bounds the walk of any container.
MAX_IFD_ENTRIES = 4_096
EXIF_PREFIX = b"Exif\x00\x00"


def orientation(block: bytes) -> int:
    """The orientation (1-8) an EXIF block declares: TIFF header, then IFD0's tag 0x0112
    (type SHORT, count 1). 1 when the block has no such tag or is malformed. An `Exif\\0\\0`
    prefix (JPEG APP1, some WebP writers) is skipped."""
    if block.startswith(EXIF_PREFIX):
        block = block[len(EXIF_PREFIX) :]
    order = {b"II": "<", b"MM": ">"}.get(block[:2])
    if order is None or len(block) < 8:
        return 1
    magic, ifd = struct.unpack_from(order + "HI", block, 2)
    if magic != 42 or ifd + 2 > len(block):
        return 1
    (count,) = struct.unpack_from(order + "H", block, ifd)
    count = min(count, MAX_IFD_ENTRIES, (len(block) - ifd - 2) // 12)
    for i in range(count):
        tag, kind, n = struct.unpack_from(order + "HHI", block, ifd + 2 + 12 * i)
        if tag == ORIENTATION_TAG:
            if kind != 3 or n != 1:
                return 1
            (value,) = struct.unpack_from(order + "H", block, ifd + 2 + 12 * i + 8)
            return value if 1 <= value <= 8 else 1
    return 1
