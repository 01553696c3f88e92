"""A vendor's output file becomes Gaussians: the worker's own .ply and .splat round-trip, a
3DGS .ply with more properties (higher-order SH, doubles) is read, a mesh is refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from splatq.services.gpu_worker.formats import ply_header, to_ply_bytes, to_splat_bytes
from splatq.services.gpu_worker.remote.convert import OutputInvalid, OutputUnsupported, to_gaussians
from tests.vendor.fake_vendor import sample_gaussians


def test_the_workers_own_ply_round_trips_exactly() -> None:
    """Our .ply back to Gaussians: every tensor equal."""
    g = sample_gaussians(50)
    back = to_gaussians(to_ply_bytes(g))
    for name in ("means", "log_scales", "rotations", "opacity_logits", "sh_dc"):
        assert torch.equal(getattr(back, name), getattr(g, name)), name


def test_a_splat_round_trips_within_its_quantisation() -> None:
    """.splat stores colour and rotation in 8 bits: positions exact, the rest close."""
    g = sample_gaussians(50)
    back = to_gaussians(to_splat_bytes(g))
    order = torch.argsort(back.means[:, 0])
    ref = torch.argsort(g.means[:, 0])
    assert torch.allclose(back.means[order], g.means[ref])
    assert torch.allclose(back.log_scales[order], g.log_scales[ref], atol=1e-5)
    assert torch.allclose(back.rgb[order], g.rgb[ref], atol=1 / 255 + 1e-6)


def test_a_3dgs_ply_with_extra_properties_in_another_order_is_read() -> None:
    """A trained 3DGS export: doubles, normals, f_rest_* and a different property order."""
    n = 10
    names = ["x", "y", "z", "f_dc_0", "f_dc_1", "f_dc_2", *[f"f_rest_{i}" for i in range(9)],
             "opacity", "scale_0", "scale_1", "scale_2", "rot_0", "rot_1", "rot_2", "rot_3",
             "nx", "ny", "nz"]  # fmt: skip
    rows = np.zeros(n, dtype=[(k, "<f8") for k in names])
    for i, k in enumerate(names):
        rows[k] = np.arange(n) + i
    header = "ply\nformat binary_little_endian 1.0\ncomment trained\nelement vertex 10\n"
    header += "".join(f"property double {k}\n" for k in names) + "end_header\n"
    g = to_gaussians(header.encode() + rows.tobytes())
    assert g.count == n
    assert g.means[3].tolist() == [3.0, 4.0, 5.0]
    assert g.opacity_logits[0].item() == names.index("opacity")


def test_meshes_and_broken_files_are_refused_with_their_codes() -> None:
    """A .glb, a .ply with faces: UPSTREAM_OUTPUT_UNSUPPORTED; a truncated or non-finite
    .ply, garbage: UPSTREAM_OUTPUT_INVALID."""
    with pytest.raises(OutputUnsupported):
        to_gaussians(b"glTF" + b"\0" * 60)
    mesh = (ply_header(3).decode().replace("end_header\n", "element face 1\n"
            "property list uchar int vertex_indices\nend_header\n")).encode()  # fmt: skip
    with pytest.raises(OutputUnsupported, match="mesh"):
        to_gaussians(mesh + b"\0" * 300)
    whole = to_ply_bytes(sample_gaussians(4))
    with pytest.raises(OutputInvalid, match="body"):
        to_gaussians(whole[:-5])
    broken = bytearray(whole)
    broken[-4:] = np.array([np.nan], dtype="<f4").tobytes()
    with pytest.raises(OutputInvalid, match="non-finite"):
        to_gaussians(bytes(broken))
    with pytest.raises(OutputInvalid):
        to_gaussians(b"not a file")
    assert OutputInvalid.code == "UPSTREAM_OUTPUT_INVALID"
