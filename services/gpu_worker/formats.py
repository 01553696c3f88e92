"""Serialise `Gaussians` to the artifact formats (.ply, .splat) and check artifact bytes.

Pure conversion on in-memory bytes: no file, network or storage I/O, and no rendering here.
"""

from __future__ import annotations

from dataclasses import dataclass
from io import BytesIO

import numpy as np
import numpy.typing as npt
from PIL import Image

from splatq.services.gpu_worker.gaussians import SH_C0, Gaussians
from splatq.shared.errors import PermanentError

ARTIFACT_INVALID = "ARTIFACT_INVALID"

# The 3DGS vertex layout for SH degree 0, in file order; every property is a float32.
PLY_PROPERTIES: tuple[str, ...] = (
    "x",
    "y",
    "z",
    "nx",
    "ny",
    "nz",
    "f_dc_0",
    "f_dc_1",
    "f_dc_2",
    "opacity",
    "scale_0",
    "scale_1",
    "scale_2",
    "rot_0",
    "rot_1",
    "rot_2",
    "rot_3",
)
PLY_MAGIC = b"ply\n"
PLY_FORMAT_LINE = "format binary_little_endian 1.0"
PLY_END_HEADER = b"end_header\n"
PLY_ROW_BYTES = 4 * len(PLY_PROPERTIES)
# Generous bound on the header (17 property lines are ~400 bytes); stops a scan of a huge body.
PLY_MAX_HEADER_BYTES = 64 * 1024

# antimatter15 .splat: position 3xf32, linear scale 3xf32, RGBA 4xu8, rotation (w,x,y,z) 4xu8.
SPLAT_ROW_BYTES = 32
SPLAT_DTYPE = np.dtype(
    [
        ("position", "<f4", (3,)),
        ("scale", "<f4", (3,)),
        ("rgba", "u1", (4,)),
        ("rotation", "u1", (4,)),
    ]
)
assert SPLAT_DTYPE.itemsize == SPLAT_ROW_BYTES

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

FloatArray = npt.NDArray[np.float32]
ByteArray = npt.NDArray[np.uint8]


class ArtifactInvalid(PermanentError, ValueError):
    """An artifact's bytes do not match the format they claim; regenerating the same input
    will not fix it, so the job fails permanently with code ARTIFACT_INVALID."""

    code: str = ARTIFACT_INVALID


@dataclass(frozen=True)
class PlyInfo:
    """What a verified .ply holds: the vertex count and the property names in file order."""

    count: int
    properties: tuple[str, ...]


def _cpu_f32(g: Gaussians) -> dict[str, FloatArray]:
    """The Gaussians' tensors as CPU float32 numpy arrays (detached; any source device)."""
    fields = {
        "means": g.means,
        "log_scales": g.log_scales,
        "rotations": g.rotations,
        "opacity_logits": g.opacity_logits,
        "sh_dc": g.sh_dc,
    }
    return {
        name: np.ascontiguousarray(t.detach().to("cpu").float().numpy(), dtype=np.float32)
        for name, t in fields.items()
    }


def ply_header(count: int) -> bytes:
    """The exact header `to_ply_bytes` writes for `count` vertices."""
    lines = ["ply", PLY_FORMAT_LINE, f"element vertex {count}"]
    lines += [f"property float {name}" for name in PLY_PROPERTIES]
    lines.append("end_header")
    return ("\n".join(lines) + "\n").encode("ascii")


def to_ply_bytes(g: Gaussians) -> bytes:
    """A binary little-endian 3DGS .ply; values stored pre-activation, normals zero."""
    a = _cpu_f32(g)
    n = g.count
    rows = np.concatenate(
        [
            a["means"].reshape(n, 3),
            np.zeros((n, 3), dtype=np.float32),
            a["sh_dc"].reshape(n, 3),
            a["opacity_logits"].reshape(n, 1),
            a["log_scales"].reshape(n, 3),
            a["rotations"].reshape(n, 4),
        ],
        axis=1,
    )
    return ply_header(n) + rows.astype("<f4").tobytes()


def _log_sigmoid(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    return -np.logaddexp(0.0, -x)


def _sigmoid(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    # tanh form: no overflow warnings for large |x|.
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _to_u8(x: npt.NDArray[np.float64]) -> ByteArray:
    return np.clip(np.rint(x), 0, 255).astype(np.uint8)


def splat_order(log_scales: FloatArray, opacity_logits: FloatArray) -> npt.NDArray[np.intp]:
    """Row order of a .splat: descending volume x opacity, i.e. exp(s0+s1+s2) * sigmoid(o),
    ranked in the log domain (no overflow) with a stable sort so ties keep input order."""
    log_key = log_scales.astype(np.float64).sum(axis=1) + _log_sigmoid(
        opacity_logits.astype(np.float64)
    )
    return np.argsort(-log_key, kind="stable")


def to_splat_bytes(g: Gaussians) -> bytes:
    """The antimatter15 .splat layout: 32 bytes per Gaussian, no header, largest first."""
    a = _cpu_f32(g)
    n = g.count
    order = splat_order(a["log_scales"], a["opacity_logits"])

    rgb = 0.5 + SH_C0 * a["sh_dc"].astype(np.float64)
    alpha = _sigmoid(a["opacity_logits"].astype(np.float64))
    q = a["rotations"].astype(np.float64)
    norm = np.linalg.norm(q, axis=1, keepdims=True)
    # A zero quaternion has no direction: write the identity rather than NaN.
    safe = np.where(norm > 0.0, norm, 1.0)
    q_unit = np.where(norm > 0.0, q / safe, np.array([1.0, 0.0, 0.0, 0.0]))

    rows = np.empty(n, dtype=SPLAT_DTYPE)
    rows["position"] = a["means"]
    rows["scale"] = np.exp(a["log_scales"])
    rows["rgba"][:, :3] = _to_u8(rgb * 255.0)
    rows["rgba"][:, 3] = _to_u8(alpha * 255.0)
    rows["rotation"] = _to_u8(q_unit * 128.0 + 128.0)
    return rows[order].tobytes()


def from_splat_bytes(data: bytes) -> dict[str, npt.NDArray[np.generic]]:
    """Decode a .splat: positions [N,3] f32, scales [N,3] f32 (linear), rgba [N,4] u8,
    rotations [N,4] u8 (quantised (w,x,y,z)); rows in file order."""
    if len(data) % SPLAT_ROW_BYTES:
        raise ArtifactInvalid(
            f".splat size {len(data)} is not a multiple of {SPLAT_ROW_BYTES} bytes"
        )
    rows = np.frombuffer(data, dtype=SPLAT_DTYPE)
    return {
        "positions": rows["position"].astype(np.float32),
        "scales": rows["scale"].astype(np.float32),
        "rgba": rows["rgba"].astype(np.uint8),
        "rotations": rows["rotation"].astype(np.uint8),
    }


def _check_count(kind: str, count: int, expected_count: int | None) -> None:
    if expected_count is not None and count != expected_count:
        raise ArtifactInvalid(f"{kind} holds {count} Gaussians, expected {expected_count}")


def _first_non_finite(values: FloatArray, names: tuple[str, ...]) -> str | None:
    """'row R property P' of the first non-finite value in a [N, len(names)] array."""
    bad = np.argwhere(~np.isfinite(values))
    if bad.size == 0:
        return None
    row, col = (int(v) for v in bad[0])
    return f"row {row} property {names[col]} is {float(values[row, col])!r}"


def _header_body_lines(header: str) -> list[str]:
    """The lines between the format line and 'end_header', after checking that frame."""
    lines = header.split("\n")
    if lines[-1] != "":
        raise ArtifactInvalid(".ply header does not end with a newline")
    lines = lines[:-1]
    if lines[0] != "ply":
        raise ArtifactInvalid(".ply header does not start with 'ply'")
    if len(lines) < 2 or lines[1] != PLY_FORMAT_LINE:
        got = lines[1] if len(lines) > 1 else ""
        raise ArtifactInvalid(f".ply format line must be {PLY_FORMAT_LINE!r}, got {got!r}")
    if lines[-1] != "end_header":
        raise ArtifactInvalid(".ply header does not end with 'end_header'")
    return lines[2:-1]


def _vertex_count(number: int, line: str, count: int | None) -> int:
    """The N of an 'element vertex N' line; any second element is an error."""
    if count is not None:
        raise ArtifactInvalid(
            f".ply header line {number}: extra element {line!r}; only 'vertex' allowed"
        )
    words = line.split(" ")
    if len(words) != 3 or words[1] != "vertex":
        raise ArtifactInvalid(
            f".ply header line {number}: expected 'element vertex N', got {line!r}"
        )
    if not words[2].isdigit():
        raise ArtifactInvalid(f".ply header line {number}: bad vertex count {line!r}")
    return int(words[2])


def _float_property(number: int, line: str, count: int | None) -> str:
    """The NAME of a 'property float NAME' line of the vertex element."""
    if count is None:
        raise ArtifactInvalid(f".ply header line {number}: property before element")
    words = line.split(" ")
    if len(words) != 3 or words[1] != "float":
        raise ArtifactInvalid(
            f".ply header line {number}: every property must be 'property float NAME', got {line!r}"
        )
    return words[2]


def _parse_ply_header(header: str) -> tuple[int, tuple[str, ...]]:
    """(vertex count, property names) of a header in exactly the `to_ply_bytes` layout;
    'comment' and 'obj_info' lines are allowed and ignored."""
    count: int | None = None
    properties: list[str] = []
    for number, line in enumerate(_header_body_lines(header), start=3):
        keyword = line.split(" ", 1)[0]
        if keyword in ("comment", "obj_info"):
            continue
        if keyword == "element":
            count = _vertex_count(number, line, count)
        elif keyword == "property":
            properties.append(_float_property(number, line, count))
        else:
            raise ArtifactInvalid(f".ply header line {number}: unexpected line {line!r}")

    if count is None:
        raise ArtifactInvalid(".ply header has no 'element vertex N' line")
    if tuple(properties) != PLY_PROPERTIES:
        raise ArtifactInvalid(
            f".ply vertex properties are {properties}, expected {list(PLY_PROPERTIES)}"
        )
    return count, tuple(properties)


def verify_ply(data: bytes, expected_count: int | None = None) -> PlyInfo:
    """Check a .ply is exactly the layout `to_ply_bytes` writes, with finite values.
    Raises ArtifactInvalid naming the first problem found."""
    if not data.startswith(PLY_MAGIC):
        raise ArtifactInvalid(".ply does not start with the 'ply' magic line")
    end = data.find(PLY_END_HEADER, 0, PLY_MAX_HEADER_BYTES)
    if end < 0:
        raise ArtifactInvalid(
            f".ply has no 'end_header' line in its first {PLY_MAX_HEADER_BYTES} bytes"
        )
    body_start = end + len(PLY_END_HEADER)
    try:
        header = data[:body_start].decode("ascii")
    except UnicodeDecodeError as exc:
        raise ArtifactInvalid(".ply header is not ASCII") from exc
    if "\r" in header:
        raise ArtifactInvalid(".ply header uses CR line endings; expected LF only")

    count, properties = _parse_ply_header(header)
    _check_count(".ply", count, expected_count)

    body = data[body_start:]
    expected_len = count * 4 * len(properties)
    if len(body) != expected_len:
        raise ArtifactInvalid(
            f".ply body is {len(body)} bytes, expected {expected_len} "
            f"({count} vertices x {len(properties)} float32)"
        )
    values = np.frombuffer(body, dtype="<f4").reshape(count, len(properties))
    problem = _first_non_finite(values, properties)
    if problem is not None:
        raise ArtifactInvalid(f".ply has a non-finite value: {problem}")
    return PlyInfo(count=count, properties=properties)


def verify_splat(data: bytes, expected_count: int | None = None) -> int:
    """Check a .splat: whole 32-byte rows, finite positions and scales, scales > 0.
    Returns the Gaussian count; raises ArtifactInvalid otherwise."""
    decoded = from_splat_bytes(data)
    count = len(data) // SPLAT_ROW_BYTES
    _check_count(".splat", count, expected_count)
    positions = decoded["positions"].astype(np.float32)
    scales = decoded["scales"].astype(np.float32)
    problem = _first_non_finite(positions, ("x", "y", "z"))
    if problem is not None:
        raise ArtifactInvalid(f".splat has a non-finite position: {problem}")
    problem = _first_non_finite(scales, ("scale_0", "scale_1", "scale_2"))
    if problem is not None:
        raise ArtifactInvalid(f".splat has a non-finite scale: {problem}")
    bad = np.argwhere(scales <= 0.0)
    if bad.size:
        row, col = (int(v) for v in bad[0])
        raise ArtifactInvalid(
            f".splat scale must be > 0: row {row} scale_{col} is {float(scales[row, col])!r}"
        )
    return count


def verify_png(data: bytes, width: int | None = None, height: int | None = None) -> tuple[int, int]:
    """Check bytes are a PNG that decodes fully (and, if given, has this width/height).
    Returns (width, height); raises ArtifactInvalid otherwise."""
    if not data.startswith(PNG_SIGNATURE):
        raise ArtifactInvalid("PNG signature missing")
    try:
        with Image.open(BytesIO(data)) as probe:
            if probe.format != "PNG":
                raise ArtifactInvalid(f"image decodes as {probe.format}, not PNG")
            probe.verify()
        with Image.open(BytesIO(data)) as image:
            image.load()
            size = (int(image.width), int(image.height))
    except ArtifactInvalid:
        raise
    except Exception as exc:  # Pillow raises many types (OSError, SyntaxError, ValueError...)
        raise ArtifactInvalid(f"PNG does not decode: {type(exc).__name__}: {exc}") from exc
    if (width is not None and size[0] != width) or (height is not None and size[1] != height):
        raise ArtifactInvalid(
            f"PNG is {size[0]}x{size[1]}, expected "
            f"{'*' if width is None else width}x{'*' if height is None else height}"
        )
    return size
