"""A vendor's output file -> `Gaussians`, which the worker then exports, renders and verifies
exactly as it does a local model's (the artifacts are always splatq's own encodings).

Accepted: a binary 3DGS `.ply` (the INRIA layout, any property order, higher-order SH and
normals ignored, float or double) and an antimatter15 `.splat`. A mesh (`.glb`, a `.ply`
with faces) is not Gaussians and is refused with a stable code. Pure bytes in, tensors out.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch

from splatq.services.gpu_worker.formats import PLY_MAX_HEADER_BYTES, SPLAT_ROW_BYTES
from splatq.services.gpu_worker.gaussians import SH_C0, Gaussians
from splatq.shared.errors import PermanentError
from splatq.shared.vendor.policy import UPSTREAM_OUTPUT_INVALID, UPSTREAM_OUTPUT_UNSUPPORTED

GLB_MAGIC = b"glTF"
PLY_MAGIC = b"ply\n"
REQUIRED_PLY = (
    "x", "y", "z", "f_dc_0", "f_dc_1", "f_dc_2", "opacity",
    "scale_0", "scale_1", "scale_2", "rot_0", "rot_1", "rot_2", "rot_3",
)  # fmt: skip
_PLY_TYPES = {
    "float": "<f4", "float32": "<f4", "double": "<f8", "float64": "<f8",
    "uchar": "u1", "uint8": "u1", "char": "i1", "int8": "i1", "ushort": "<u2", "uint16": "<u2",
    "short": "<i2", "int16": "<i2", "uint": "<u4", "uint32": "<u4", "int": "<i4", "int32": "<i4",
}  # fmt: skip
# A generous bound: the largest single-image reconstructions are a few million Gaussians.
MAX_GAUSSIANS = 20_000_000


class OutputInvalid(PermanentError):
    code = UPSTREAM_OUTPUT_INVALID


class OutputUnsupported(PermanentError):
    code = UPSTREAM_OUTPUT_UNSUPPORTED


def detect_format(data: bytes, declared: str = "auto") -> str:
    """ply | splat | glb, by the configured format or the file's magic bytes."""
    if declared != "auto":
        return declared
    if data.startswith(PLY_MAGIC):
        return "ply"
    if data.startswith(GLB_MAGIC):
        return "glb"
    if data and len(data) % SPLAT_ROW_BYTES == 0:
        return "splat"
    raise OutputInvalid(f"the vendor's output ({len(data)} bytes) is neither a .ply nor a .splat")


def to_gaussians(data: bytes, declared: str = "auto") -> Gaussians:
    kind = detect_format(data, declared)
    if kind == "glb":
        raise OutputUnsupported("the vendor returned a mesh (.glb), not Gaussians")
    gaussians = _from_ply(data) if kind == "ply" else _from_splat(data)
    if gaussians.count == 0:
        raise OutputInvalid("the vendor's output holds no Gaussians")
    for name in ("means", "log_scales", "rotations", "opacity_logits", "sh_dc"):
        if not bool(torch.isfinite(getattr(gaussians, name)).all()):
            raise OutputInvalid(f"the vendor's output has a non-finite {name}")
    return gaussians


def _ply_header(data: bytes) -> tuple[int, list[tuple[str, str]], int]:
    """(vertex count, [(name, numpy dtype)], body offset) of a binary little-endian .ply."""
    end = data.find(b"end_header\n", 0, PLY_MAX_HEADER_BYTES)
    if end < 0:
        raise OutputInvalid(".ply has no end_header line")
    try:
        lines = data[:end].decode("ascii").split("\n")
    except UnicodeDecodeError:
        raise OutputInvalid(".ply header is not ASCII") from None
    count, props, element = -1, [], ""
    for line in (raw.strip() for raw in lines[1:]):
        words = line.split()
        if not words or words[0] in ("comment", "obj_info"):
            continue
        if words[0] == "format":
            if words[1:2] != ["binary_little_endian"]:
                raise OutputInvalid(f".ply format {' '.join(words[1:])!r} is not binary LE")
        elif words[0] == "element" and len(words) == 3:
            element = words[1]
            if element == "vertex":
                count = int(words[2]) if words[2].isdigit() else -1
            elif words[2] != "0":  # an empty face element is harmless
                what = "a mesh .ply (faces)" if element == "face" else f"a .ply with {element}s"
                raise OutputUnsupported(f"the vendor returned {what}, not Gaussians")
        elif words[0] == "property" and element == "vertex":
            if len(words) != 3 or words[1] not in _PLY_TYPES:
                raise OutputInvalid(f".ply vertex property line {line!r} is not supported")
            props.append((words[2], _PLY_TYPES[words[1]]))
    if not 0 <= count <= MAX_GAUSSIANS:
        raise OutputInvalid(".ply has no readable vertex count (or too many vertices)")
    return count, props, end + len(b"end_header\n")


def _from_ply(data: bytes) -> Gaussians:
    count, props, offset = _ply_header(data)
    names = [n for n, _ in props]
    missing = [n for n in REQUIRED_PLY if n not in names]
    if missing:
        raise OutputInvalid(f".ply lacks the 3DGS properties {missing}")
    dtype = np.dtype(props)
    if len(data) - offset != count * dtype.itemsize:
        raise OutputInvalid(
            f".ply body is {len(data) - offset} bytes, expected {count * dtype.itemsize}"
        )
    rows = np.frombuffer(data, dtype=dtype, count=count, offset=offset)

    def cols(*names: str) -> torch.Tensor:
        stacked = np.stack([rows[n].astype(np.float32) for n in names], axis=1)
        return torch.from_numpy(np.ascontiguousarray(stacked))

    return Gaussians(
        means=cols("x", "y", "z"),
        log_scales=cols("scale_0", "scale_1", "scale_2"),
        rotations=cols("rot_0", "rot_1", "rot_2", "rot_3"),
        opacity_logits=cols("opacity")[:, 0].contiguous(),
        sh_dc=cols("f_dc_0", "f_dc_1", "f_dc_2"),
    )


def _logit(p: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    p = np.clip(p, 1e-4, 1 - 1e-4)
    return np.asarray(np.log(p / (1 - p)))


def _from_splat(data: bytes) -> Gaussians:
    if len(data) % SPLAT_ROW_BYTES:
        raise OutputInvalid(f".splat size {len(data)} is not a multiple of {SPLAT_ROW_BYTES}")
    if len(data) // SPLAT_ROW_BYTES > MAX_GAUSSIANS:
        raise OutputInvalid(".splat holds too many Gaussians")
    rows = np.frombuffer(data, dtype=np.dtype([
        ("position", "<f4", (3,)), ("scale", "<f4", (3,)),
        ("rgba", "u1", (4,)), ("rotation", "u1", (4,)),
    ]))  # fmt: skip
    scales = rows["scale"].astype(np.float64)
    if (scales <= 0).any():
        raise OutputInvalid(".splat has a scale <= 0")
    rgba = rows["rgba"].astype(np.float64) / 255.0
    rotation = (rows["rotation"].astype(np.float64) - 128.0) / 128.0

    def tensor(a: npt.NDArray[np.generic]) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))

    return Gaussians(
        means=tensor(rows["position"]),
        log_scales=tensor(np.log(scales)),
        rotations=tensor(rotation),
        opacity_logits=tensor(_logit(rgba[:, 3])),
        sh_dc=tensor((rgba[:, :3] - 0.5) / SH_C0),
    )
