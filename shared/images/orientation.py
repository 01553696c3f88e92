"""EXIF orientations (1-8) as the eight symmetries of a rectangle: composing HEIF's irot and
imir transforms into one, and which of them swap width and height.

Pure: no Pillow, no I/O; `apply` turns decoded pixels (a numpy array) upright.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

# An orientation as (mirror left-right first?, then quarter turns anticlockwise): what turns
# the stored pixels into the upright picture. EXIF 2 is a left-right mirror, 4 top-bottom,
# 5 the transpose, 6 "rotate 90 clockwise to view", 8 "rotate 90 anticlockwise".
_AS_SYMMETRY: dict[int, tuple[bool, int]] = {
    1: (False, 0), 2: (True, 0), 3: (False, 2), 4: (True, 2),
    5: (True, 1), 6: (False, 3), 7: (True, 3), 8: (False, 1),
}  # fmt: skip
_FROM_SYMMETRY = {v: k for k, v in _AS_SYMMETRY.items()}


def swaps_sides(orientation: int) -> bool:
    """True when the upright picture is the stored one on its side (5-8)."""
    return _AS_SYMMETRY.get(orientation, (False, 0))[1] % 2 == 1


def upright_size(width: int, height: int, orientation: int) -> tuple[int, int]:
    return (height, width) if swaps_sides(orientation) else (width, height)


def from_transforms(transforms: Iterable[tuple[str, int]]) -> int:
    """The one orientation equal to HEIF transforms applied in order: ("irot", n) turns n
    quarters anticlockwise; ("imir", 1) exchanges left and right, ("imir", 0) top and
    bottom (ISO/IEC 23008-12:2022's `mode`, as libavif and libheif read it)."""
    mirror, turns = False, 0
    for kind, value in transforms:
        if kind == "irot":
            turns = (turns + value) % 4
        elif kind == "imir":
            # A mirror after turns t equals turns -t after a mirror; top-bottom is a
            # left-right mirror and a half turn.
            mirror, turns = not mirror, (-turns + (0 if value else 2)) % 4
    return _FROM_SYMMETRY[(mirror, turns)]


def apply(pixels: np.ndarray, orientation: int) -> np.ndarray:
    """The [H, W, ...] array turned upright (a view: mirror left-right, then quarter turns
    anticlockwise, as the symmetry says)."""
    mirror, turns = _AS_SYMMETRY.get(orientation, (False, 0))
    if mirror:
        pixels = pixels[:, ::-1]
    return np.rot90(pixels, turns) if turns else pixels
