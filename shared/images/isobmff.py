"""What a HEIF/HEIC or AVIF still image declares, read from its ISO-BMFF boxes (ISO/IEC
23008-12) without decoding: the primary item, its size, grid tiles, alpha and transforms.

Pure and bounded: every box, item, property, reference and extent counts against a fixed
limit (past it: image_too_complex), a box or extent that runs past the end is invalid_image,
so a hostile file costs a walk linear in its bytes and never a decoder's memory.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from splatq.shared.images.codes import (
    IMAGE_TOO_COMPLEX,
    INVALID_IMAGE,
    UNSUPPORTED_MEDIA_TYPE,
    HeaderRejected,
)

# Phones write a few hundred items at most (an iPhone's 48 MP HEIC: 192 tiles of 512x512, a
# thumbnail, EXIF, depth; a 200 MP one ~800 tiles): these bounds leave room and still stop a
# file of a million empty items or references before the decoder walks them (libheif does).
MAX_BOXES = 20_000
MAX_ITEMS = 4_096
MAX_PROPERTIES = 4_096
MAX_REFERENCES = 16_384
MAX_EXTENTS = 16_384
MAX_GRID_TILES = 4_096

# Brands that name the codec Pillow or pillow-heif decodes; `mif1`/`msf1` alone say nothing.
AVIF_BRANDS = frozenset({b"avif", b"avis"})
HEIC_BRANDS = frozenset({b"heic", b"heix", b"heim", b"heis", b"hevc", b"hevx", b"mif1", b"msf1"})
# The coded item type of each family (a grid's tiles must be of it too).
CODED_ITEM = {"HEIF": "hvc1", "AVIF": "av01"}
# auxC types that make an auxiliary image the primary's alpha plane.
_ALPHA_AUX = (b"urn:mpeg:hevc:2015:auxid:1", b"urn:mpeg:mpegB:cicp:systems:auxiliary:alpha")


def brand_family(data: bytes) -> str | None:
    """ "AVIF" or "HEIF" from the `ftyp` box's major and compatible brands, else None."""
    if len(data) < 16 or data[4:8] != b"ftyp":
        return None
    size = int.from_bytes(data[0:4], "big")
    brands = {data[8:12]}
    end = min(max(size, 16), len(data), 4096)
    brands.update(data[i : i + 4] for i in range(16, end - 3, 4))
    if brands & AVIF_BRANDS:
        return "AVIF"
    if brands & HEIC_BRANDS:
        return "HEIF"
    return None


@dataclass(frozen=True)
class HeifLayout:
    """The primary image as the file declares it. `width` x `height` is its coded size (the
    `ispe`, or the grid's output size when larger), before any transform; `transforms` the
    irot/imir properties in the order they apply: ("irot", quarter turns anticlockwise) or
    ("imir", 0: top and bottom exchanged, 1: left and right)."""

    family: str
    primary_type: str
    width: int
    height: int
    transforms: tuple[tuple[str, int], ...] = ()
    has_alpha: bool = False
    bit_depth: int = 8
    items: int = 0
    tiles: int = 0


@dataclass
class _Meta:
    primary: int | None = None
    handler: bytes = b""
    types: dict[int, str] = field(default_factory=dict)
    extents: dict[int, list[tuple[int, int, int]]] = field(default_factory=dict)
    refs: dict[tuple[bytes, int], list[int]] = field(default_factory=dict)
    properties: list[tuple[bytes, int, int]] = field(default_factory=list)
    associations: dict[int, list[int]] = field(default_factory=dict)
    idat: tuple[int, int] = (0, 0)


class _Walk:
    """One file's walk: the shared box budget and the readers of each box."""

    def __init__(self, data: bytes, family: str) -> None:
        self.data = data
        self.family = family
        self.boxes_seen = 0

    def fail(self, what: str) -> HeaderRejected:
        return HeaderRejected(INVALID_IMAGE, f"the {self.family} header is unreadable: {what}")

    def boxes(self, start: int, end: int) -> list[tuple[bytes, int, int]]:
        """(type, payload start, payload end) of the boxes in [start, end)."""
        out = []
        i = start
        while i + 8 <= end:
            self.boxes_seen += 1
            if self.boxes_seen > MAX_BOXES:
                raise HeaderRejected(
                    IMAGE_TOO_COMPLEX, f"the {self.family} file has over {MAX_BOXES} boxes"
                )
            size, kind = struct.unpack_from(">I4s", self.data, i)
            header = 8
            if size == 1:
                if i + 16 > end:
                    raise self.fail(f"box {kind!r} at byte {i} is cut")
                (size,) = struct.unpack_from(">Q", self.data, i + 8)
                header = 16
            elif size == 0:
                size = end - i
            if size < header or i + size > end:
                raise self.fail(f"box {kind!r} at byte {i} runs past its container")
            out.append((kind, i + header, i + size))
            i += size
        return out

    def uint(self, pos: int, size: int, end: int) -> int:
        if size == 0:
            return 0
        if pos + size > end:
            raise self.fail(f"a field at byte {pos} runs past its box")
        return int.from_bytes(self.data[pos : pos + size], "big")

    # -- meta ---------------------------------------------------------------------------

    def meta(self, start: int, end: int) -> _Meta:
        meta = _Meta()
        children = self.boxes(start + 4, end)  # a FullBox: version and flags first
        for kind, s, e in children:
            if kind == b"idat":
                meta.idat = (s, e)
        for kind, s, e in children:
            if kind == b"hdlr":
                meta.handler = self.data[s + 8 : s + 12]
            elif kind == b"pitm":
                meta.primary = self.uint(s + 4, 2 if self.data[s] == 0 else 4, e)
            elif kind == b"iinf":
                self.item_infos(meta, s, e)
            elif kind == b"iloc":
                self.locations(meta, s, e)
            elif kind == b"iref":
                self.references(meta, s, e)
            elif kind == b"iprp":
                self.properties(meta, s, e)
        return meta

    def item_infos(self, meta: _Meta, s: int, e: int) -> None:
        wide = self.data[s] != 0
        count = self.uint(s + 4, 4 if wide else 2, e)
        if count > MAX_ITEMS:
            raise HeaderRejected(
                IMAGE_TOO_COMPLEX, f"the {self.family} file declares {count} items (at most"
                f" {MAX_ITEMS})"
            )  # fmt: skip
        for kind, bs, be in self.boxes(s + (8 if wide else 6), e):
            if kind != b"infe" or be - bs < 12:
                continue
            version = self.data[bs]
            if version < 2:
                continue  # no item type before version 2: never an image item
            id_size = 2 if version == 2 else 4
            item = self.uint(bs + 4, id_size, be)
            kind_at = bs + 4 + id_size + 2
            meta.types[item] = self.data[kind_at : kind_at + 4].decode("latin-1")
            if len(meta.types) > MAX_ITEMS:
                raise HeaderRejected(
                    IMAGE_TOO_COMPLEX, f"the {self.family} file has over {MAX_ITEMS} items"
                )

    def locations(self, meta: _Meta, s: int, e: int) -> None:
        version = self.data[s]
        sizes = self.uint(s + 4, 2, e)
        offset_size, length_size = sizes >> 12, (sizes >> 8) & 0xF
        base_size, index_size = (sizes >> 4) & 0xF, sizes & 0xF if version in (1, 2) else 0
        pos = s + 6
        count = self.uint(pos, 4 if version == 2 else 2, e)
        pos += 4 if version == 2 else 2
        if count > MAX_ITEMS:
            raise HeaderRejected(IMAGE_TOO_COMPLEX, f"the {self.family} file locates {count} items")
        extents_seen = 0
        for _ in range(count):
            item = self.uint(pos, 4 if version == 2 else 2, e)
            pos += 4 if version == 2 else 2
            method = 0
            if version in (1, 2):
                method = self.uint(pos, 2, e) & 0xF
                pos += 2
            pos += 2  # data_reference_index
            base = self.uint(pos, base_size, e)
            pos += base_size
            n = self.uint(pos, 2, e)
            pos += 2
            extents_seen += n
            if extents_seen > MAX_EXTENTS:
                raise HeaderRejected(
                    IMAGE_TOO_COMPLEX, f"the {self.family} file has over {MAX_EXTENTS} extents"
                )
            spans = []
            for _ in range(n):
                pos += index_size
                offset = self.uint(pos, offset_size, e)
                pos += offset_size
                length = self.uint(pos, length_size, e)
                pos += length_size
                spans.append((method, base + offset, length))
            meta.extents[item] = spans

    def references(self, meta: _Meta, s: int, e: int) -> None:
        id_size = 2 if self.data[s] == 0 else 4
        total = 0
        for kind, bs, be in self.boxes(s + 4, e):
            source = self.uint(bs, id_size, be)
            n = self.uint(bs + id_size, 2, be)
            total += n
            if total > MAX_REFERENCES:
                raise HeaderRejected(
                    IMAGE_TOO_COMPLEX,
                    f"the {self.family} file has over {MAX_REFERENCES} item references",
                )
            first = bs + id_size + 2
            targets = [self.uint(first + k * id_size, id_size, be) for k in range(n)]
            meta.refs.setdefault((kind, source), []).extend(targets)

    def properties(self, meta: _Meta, s: int, e: int) -> None:
        for kind, bs, be in self.boxes(s, e):
            if kind == b"ipco":
                meta.properties = self.boxes(bs, be)
                if len(meta.properties) > MAX_PROPERTIES:
                    raise HeaderRejected(
                        IMAGE_TOO_COMPLEX,
                        f"the {self.family} file has over {MAX_PROPERTIES} properties",
                    )
            elif kind == b"ipma":
                self.associations(meta, bs, be)

    def associations(self, meta: _Meta, s: int, e: int) -> None:
        version, flags = self.data[s], self.uint(s + 1, 3, e)
        count = self.uint(s + 4, 4, e)
        if count > MAX_ITEMS:
            raise HeaderRejected(
                IMAGE_TOO_COMPLEX, f"the {self.family} file associates {count} items"
            )
        pos, id_size, wide = s + 8, 2 if version < 1 else 4, bool(flags & 1)
        for _ in range(count):
            item = self.uint(pos, id_size, e)
            n = self.uint(pos + id_size, 1, e)
            pos += id_size + 1
            indices = []
            for _ in range(n):
                raw = self.uint(pos, 2 if wide else 1, e)
                pos += 2 if wide else 1
                indices.append(raw & (0x7FFF if wide else 0x7F))
            meta.associations.setdefault(item, []).extend(indices)

    # -- the primary image --------------------------------------------------------------

    def item_properties(self, meta: _Meta, item: int) -> list[tuple[bytes, int, int]]:
        """The item's properties in association order (index 0 means none)."""
        props = meta.properties
        return [props[i - 1] for i in meta.associations.get(item, []) if 0 < i <= len(props)]

    def item_bytes(self, meta: _Meta, item: int) -> bytes:
        """The item's data (a grid descriptor: a dozen bytes), from the file or from idat."""
        out = b""
        for method, offset, length in meta.extents.get(item, []):
            if method == 0:
                out += self.data[offset : offset + length]
            elif method == 1:
                start = meta.idat[0] + offset
                out += self.data[start : min(start + length, meta.idat[1])]
            if len(out) > 64:
                break
        return out

    def check_extents(self, meta: _Meta) -> None:
        """invalid_image when an item's data lies past the end of the file (truncation)."""
        for item, spans in meta.extents.items():
            for method, offset, length in spans:
                limit = len(self.data) if method == 0 else meta.idat[1] - meta.idat[0]
                if method in (0, 1) and offset + length > limit:
                    raise self.fail(
                        f"item {item}'s data ends at byte {offset + length}, past the end"
                        f" ({limit}): the file is truncated"
                    )


def read_layout(data: bytes) -> HeifLayout:
    """The primary image of a HEIF/HEIC or AVIF file, or HeaderRejected (invalid_image: no
    meta box, no primary item, no size, data past the end; image_too_complex: past a
    structure limit; unsupported_media_type: a primary image of another codec)."""
    family = brand_family(data)
    if family is None:
        raise HeaderRejected(UNSUPPORTED_MEDIA_TYPE, "not a HEIF or AVIF image")
    walk = _Walk(data, family)
    metas = [(s, e) for kind, s, e in walk.boxes(0, len(data)) if kind == b"meta"]
    if not metas:
        raise walk.fail("no meta box (an image sequence, or not a still image)")
    meta = walk.meta(*metas[0])
    if meta.handler != b"pict" or meta.primary is None:
        raise walk.fail("no picture handler or no primary item")
    walk.check_extents(meta)
    primary = meta.primary
    kind = meta.types.get(primary, "")
    coded = CODED_ITEM[family]
    tiles: list[int] = []
    if kind == "grid":
        tiles = meta.refs.get((b"dimg", primary), [])
        if not tiles:
            raise walk.fail("the grid image has no tiles")
        if len(tiles) > MAX_GRID_TILES:
            raise HeaderRejected(
                IMAGE_TOO_COMPLEX,
                f"the {family} grid has {len(tiles)} tiles (at most {MAX_GRID_TILES})",
            )
        if any(meta.types.get(t) != coded for t in tiles):
            raise walk.fail(f"a grid tile is not a {coded} image")
    elif kind != coded:
        raise HeaderRejected(
            UNSUPPORTED_MEDIA_TYPE,
            f"the {family} file's primary image is of type {kind or 'unknown'!r}; only"
            f" {coded} (or a grid of it) is accepted",
        )
    width, height, ops, depth = _primary_geometry(walk, meta, primary, tiles)
    return HeifLayout(
        family=family,
        primary_type=kind,
        width=width,
        height=height,
        transforms=ops,
        has_alpha=_has_alpha(walk, meta, primary),
        bit_depth=depth,
        items=len(meta.types),
        tiles=len(tiles),
    )


def _primary_geometry(
    walk: _Walk, meta: _Meta, primary: int, tiles: list[int]
) -> tuple[int, int, tuple[tuple[str, int], ...], int]:
    width = height = 0
    depth = 8
    ops: list[tuple[str, int]] = []
    data = walk.data
    for kind, s, e in walk.item_properties(meta, primary):
        if kind == b"ispe" and e - s >= 12:
            width, height = struct.unpack_from(">II", data, s + 4)
        elif kind == b"irot" and e - s >= 1:
            ops.append(("irot", data[s] & 3))
        elif kind == b"imir" and e - s >= 1:
            ops.append(("imir", data[s] & 1))
        elif kind == b"pixi" and e - s >= 5:
            depth = max([depth, *data[s + 5 : min(e, s + 5 + data[s + 4])]])
    if tiles:
        grid = walk.item_bytes(meta, primary)
        if len(grid) < 8:
            raise walk.fail("the grid descriptor is missing or cut")
        wide = grid[1] & 1
        rows, cols = grid[2] + 1, grid[3] + 1
        if rows * cols > len(tiles):
            raise walk.fail(f"the grid is {rows}x{cols} but has {len(tiles)} tiles")
        fmt = ">II" if wide else ">HH"
        if len(grid) < 4 + struct.calcsize(fmt):
            raise walk.fail("the grid descriptor is cut")
        out_w, out_h = struct.unpack_from(fmt, grid, 4)
        width, height = max(width, out_w), max(height, out_h)
    if width <= 0 or height <= 0:
        raise walk.fail("the primary image has no size (ispe)")
    return int(width), int(height), tuple(ops), depth


def _has_alpha(walk: _Walk, meta: _Meta, primary: int) -> bool:
    """An auxiliary item that refers to the primary (auxl) and is typed as alpha (auxC)."""
    for (kind, source), targets in meta.refs.items():
        if kind != b"auxl" or primary not in targets:
            continue
        for prop, s, e in walk.item_properties(meta, source):
            if prop == b"auxC" and walk.data[s + 4 : e].split(b"\x00", 1)[0] in _ALPHA_AUX:
                return True
    return False
