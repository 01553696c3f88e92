"""`.spz`: Niantic's compressed Gaussian-splat format (the payload of glTF's
`KHR_gaussian_splatting` compression extension), written from `Gaussians` and checked.

A gzip stream of a 16-byte header and the attributes, each for every Gaussian in turn:
positions (24-bit signed fixed point, `fractional_bits` of fraction), alphas (sigmoid x 255),
colours (DC coefficient x 0.15 x 255 + 127.5), scales ((log + 10) x 16) and rotations
(version 3: the smallest three components of the unit quaternion, 10 bits each, and the
index of the largest in 2 bits). Degree-0 colour only, as the other artifacts. The format
stores RUB axes (OpenGL: x right, y up, z backward); the Gaussians are in the input camera's
RDF frame (OpenCV), so y and z flip on the way in (and back in every reader).

Pure conversion on in-memory bytes, like `formats`.
"""

from __future__ import annotations

import gzip
import math
import struct
import zlib

import numpy as np
import numpy.typing as npt

from splatq.services.gpu_worker.formats import ArtifactInvalid, FloatArray, _cpu_f32
from splatq.services.gpu_worker.gaussians import Gaussians

SPZ_MAGIC = 0x5053474E  # "NGSP" little-endian
SPZ_VERSION = 3
SPZ_HEADER = struct.Struct("<IIIBBBB")  # magic, version, count, sh degree, fraction bits, flags, 0
FRACTIONAL_BITS = 12  # ~0.24 mm steps for positions within +-2048 units
COLOR_SCALE = 0.15  # the DC coefficient's scale: leaves room for colours a little out of [0, 1]
# Bytes per Gaussian before gzip at SH degree 0: position 9, alpha 1, colour 3, scale 3,
# rotation 4 (version 3) or 3 (version 2).
ROW_BYTES = {2: 19, 3: 20}
_MAX_FIXED = 2**23 - 1
_SQRT_HALF = math.sqrt(0.5)
_RDF_TO_RUB = np.array([1.0, -1.0, -1.0], dtype=np.float64)


def _u8(x: npt.NDArray[np.float64]) -> npt.NDArray[np.uint8]:
    return np.clip(np.rint(x), 0, 255).astype(np.uint8)


def fractional_bits_for(positions: FloatArray) -> int:
    """FRACTIONAL_BITS, or fewer when a coordinate would not fit 24 signed bits."""
    largest = float(np.abs(positions).max()) if positions.size else 0.0
    bits = FRACTIONAL_BITS
    while bits > 0 and largest * (1 << bits) > _MAX_FIXED:
        bits -= 1
    return bits


def _positions(means: FloatArray, bits: int) -> npt.NDArray[np.uint8]:
    fixed = np.rint(means.astype(np.float64) * _RDF_TO_RUB * (1 << bits))
    fixed = np.clip(fixed, -_MAX_FIXED - 1, _MAX_FIXED).astype("<i4")
    return fixed.reshape(-1, 1).view(np.uint8)[:, :3].reshape(-1)


def _rotations(wxyz: FloatArray) -> npt.NDArray[np.uint8]:
    """Version 3's smallest-three packing of (x, y, z, w) quaternions in RUB axes."""
    q = wxyz.astype(np.float64)[:, [1, 2, 3, 0]]  # (x, y, z, w)
    q[:, 1:3] *= -1.0  # RDF -> RUB: a half turn about x flips the y and z parts
    norm = np.linalg.norm(q, axis=1, keepdims=True)
    q = np.where(norm > 0.0, q / np.where(norm > 0.0, norm, 1.0), [0.0, 0.0, 0.0, 1.0])
    largest = np.argmax(np.abs(q), axis=1)
    rows = np.arange(len(q))
    q *= np.where(q[rows, largest] < 0.0, -1.0, 1.0)[:, None]  # q and -q: the same rotation
    packed = largest.astype(np.uint32)
    for i in range(4):
        skip = largest == i
        mag = np.minimum(np.floor(511.0 * np.abs(q[:, i]) / _SQRT_HALF + 0.5), 511)
        field = (q[:, i] < 0.0).astype(np.uint32) << 9 | mag.astype(np.uint32)
        packed = np.where(skip, packed, packed << 10 | field)
    out: npt.NDArray[np.uint8] = packed.astype("<u4").view(np.uint8)
    return out


def to_spz_bytes(g: Gaussians) -> bytes:
    """The Gaussians as a version-3 .spz (gzip level 6, no timestamp: same input, same bytes),
    in the PLY's row order."""
    a = _cpu_f32(g)
    n = g.count
    bits = fractional_bits_for(a["means"])
    alpha = 0.5 * (1.0 + np.tanh(0.5 * a["opacity_logits"].astype(np.float64)))
    body = b"".join(
        [
            SPZ_HEADER.pack(SPZ_MAGIC, SPZ_VERSION, n, 0, bits, 0, 0),
            _positions(a["means"].reshape(n, 3), bits).tobytes(),
            _u8(alpha * 255.0).tobytes(),
            _u8(a["sh_dc"].astype(np.float64) * (COLOR_SCALE * 255.0) + 127.5).tobytes(),
            _u8((a["log_scales"].astype(np.float64) + 10.0) * 16.0).tobytes(),
            _rotations(a["rotations"].reshape(n, 4)).tobytes(),
        ]
    )
    return gzip.compress(body, compresslevel=6, mtime=0)


def verify_spz(data: bytes, expected_count: int | None = None) -> int:
    """Check a .spz: a whole gzip stream, the magic, a known version, SH degree 0 and exactly
    the attribute bytes its count needs. Returns the Gaussian count; raises ArtifactInvalid."""
    if data[:2] != b"\x1f\x8b":
        raise ArtifactInvalid(".spz is not a gzip stream")
    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        head = inflate.decompress(data, SPZ_HEADER.size)
    except zlib.error as exc:
        raise ArtifactInvalid(f".spz does not inflate: {exc}") from None
    if len(head) < SPZ_HEADER.size:
        raise ArtifactInvalid(".spz is shorter than its 16-byte header")
    magic, version, count, degree, _bits, _flags, reserved = SPZ_HEADER.unpack(head)
    if magic != SPZ_MAGIC:
        raise ArtifactInvalid(f".spz magic is {magic:#010x}, expected {SPZ_MAGIC:#010x}")
    if version not in ROW_BYTES or degree != 0 or reserved != 0:
        raise ArtifactInvalid(f".spz version {version}, SH degree {degree}: not what we write")
    if expected_count is not None and count != expected_count:
        raise ArtifactInvalid(f".spz holds {count} Gaussians, expected {expected_count}")
    want = count * ROW_BYTES[version]
    rest = b""
    try:
        # At most one byte past what the count needs: a longer body is an error, not memory.
        while len(rest) <= want:
            chunk = inflate.decompress(inflate.unconsumed_tail, want + 1 - len(rest))
            if not chunk:
                break
            rest += chunk
    except zlib.error as exc:
        raise ArtifactInvalid(f".spz does not inflate: {exc}") from None
    if len(rest) != want or not inflate.eof:
        raise ArtifactInvalid(f".spz body is not the {want} bytes {count} Gaussians need")
    return int(count)
