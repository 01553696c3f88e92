"""A minimal, independent .spz reader written from the format's description (Niantic's spz
README and its published constants), used by the tests to decode what the worker writes.

No PyPI package reads .spz here (the one named `spz` is a Rust source build), so this reader is
deliberately written differently from `services/gpu_worker/spz.py`: row by row in plain
Python over the inflated bytes, returning RDF-frame values (the PLY's axes)."""

from __future__ import annotations

import gzip
import math
import struct
from dataclasses import dataclass

MAGIC = b"NGSP"


@dataclass(frozen=True)
class SpzCloud:
    version: int
    fractional_bits: int
    positions: list[tuple[float, float, float]]  # RDF (x right, y down, z forward)
    alphas: list[float]  # activated opacity in [0, 1]
    colors: list[tuple[float, float, float]]  # the DC coefficient (f_dc)
    log_scales: list[tuple[float, float, float]]
    rotations: list[tuple[float, float, float, float]]  # unit (w, x, y, z), RDF


def _smallest_three(word: int) -> list[float]:
    """(x, y, z, w) from a version-3 rotation: 2 bits of index, then 3 x (sign, 9 bits)."""
    largest = word >> 30
    q = [0.0, 0.0, 0.0, 0.0]
    rest = [i for i in range(4) if i != largest]
    # the first stored component sits in the highest 10 bits below the index
    for slot, i in enumerate(rest):
        shift = 10 * (2 - slot)
        field = (word >> shift) & 0x3FF
        value = (field & 0x1FF) / 511.0 * math.sqrt(0.5)
        q[i] = -value if field & 0x200 else value
    q[largest] = math.sqrt(max(0.0, 1.0 - sum(v * v for v in q)))
    return q


def read_spz(data: bytes) -> SpzCloud:
    raw = gzip.decompress(data)
    magic, version, count, degree, bits, _flags, _reserved = struct.unpack_from("<4sIIBBBB", raw)
    assert magic == MAGIC, magic
    assert version in (2, 3), version
    assert degree == 0, degree
    rot_bytes = 4 if version == 3 else 3
    sizes = [9 * count, count, 3 * count, 3 * count, rot_bytes * count]
    assert len(raw) == 16 + sum(sizes), (len(raw), sizes)
    offsets = [16]
    for size in sizes:
        offsets.append(offsets[-1] + size)
    pos_at, alpha_at, color_at, scale_at, rot_at = offsets[:5]
    positions, alphas, colors, scales, rotations = [], [], [], [], []
    for i in range(count):
        xyz = []
        for axis in range(3):
            b = raw[pos_at + 9 * i + 3 * axis : pos_at + 9 * i + 3 * axis + 3]
            fixed = int.from_bytes(b, "little", signed=True)
            xyz.append(fixed / (1 << bits))
        positions.append((xyz[0], -xyz[1], -xyz[2]))  # RUB -> RDF
        alphas.append(raw[alpha_at + i] / 255.0)
        c = raw[color_at + 3 * i : color_at + 3 * i + 3]
        colors.append(tuple((v / 255.0 - 0.5) / 0.15 for v in c))  # type: ignore[misc]
        s = raw[scale_at + 3 * i : scale_at + 3 * i + 3]
        scales.append(tuple(v / 16.0 - 10.0 for v in s))  # type: ignore[misc]
        if version == 3:
            (word,) = struct.unpack_from("<I", raw, rot_at + 4 * i)
            x, y, z, w = _smallest_three(word)
        else:
            r = raw[rot_at + 3 * i : rot_at + 3 * i + 3]
            x, y, z = (v / 127.5 - 1.0 for v in r)
            w = math.sqrt(max(0.0, 1.0 - x * x - y * y - z * z))
        rotations.append((w, x, -y, -z))  # RUB -> RDF
    return SpzCloud(version, bits, positions, alphas, colors, scales, rotations)  # type: ignore[arg-type]
