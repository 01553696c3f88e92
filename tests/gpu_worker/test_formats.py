"""The artifact formats: .ply and .splat writers round-trip exactly; verifiers reject bad bytes."""

from __future__ import annotations

from collections.abc import Callable
from io import BytesIO

import numpy as np
import numpy.typing as npt
import pytest
import torch
from PIL import Image
from plyfile import PlyData

from splatq.services.gpu_worker.formats import (
    PLY_PROPERTIES,
    SPLAT_ROW_BYTES,
    ArtifactInvalid,
    PlyInfo,
    from_splat_bytes,
    to_ply_bytes,
    to_splat_bytes,
    verify_ply,
    verify_png,
    verify_splat,
)
from splatq.services.gpu_worker.gaussians import SH_C0, Gaussians
from splatq.shared.errors import PermanentError, classify

F64 = npt.NDArray[np.float64]


def random_gaussians(n: int, seed: int = 1234) -> Gaussians:
    """N Gaussians with realistic pre-activation ranges from a seeded generator."""
    gen = torch.Generator().manual_seed(seed)
    means = torch.randn(n, 3, generator=gen) * 0.5 + torch.tensor([0.0, 0.0, 2.0])
    log_scales = torch.rand(n, 3, generator=gen) * 5.0 - 6.0  # e^-6 .. e^-1
    rotations = torch.randn(n, 4, generator=gen) * 2.0  # deliberately unnormalised
    opacity_logits = torch.randn(n, generator=gen) * 3.0
    sh_dc = torch.randn(n, 3, generator=gen) * 1.5  # some colours fall outside [0, 1]
    return Gaussians(means, log_scales, rotations, opacity_logits, sh_dc)


def expected_header(n: int) -> bytes:
    props = "".join(f"property float {name}\n" for name in PLY_PROPERTIES)
    return (
        f"ply\nformat binary_little_endian 1.0\nelement vertex {n}\n{props}end_header\n"
    ).encode("ascii")


def as_f32(t: torch.Tensor) -> npt.NDArray[np.float32]:
    return t.detach().cpu().numpy().astype(np.float32)


def sigmoid64(x: F64) -> F64:
    return 1.0 / (1.0 + np.exp(-x))


def expected_order(g: Gaussians) -> npt.NDArray[np.intp]:
    """Stable descending sort of volume x opacity, recomputed independently in float64."""
    log_scales = as_f32(g.log_scales).astype(np.float64)
    opacity = sigmoid64(as_f32(g.opacity_logits).astype(np.float64))
    key = np.exp(log_scales.sum(axis=1)) * opacity
    return np.argsort(-key, kind="stable")


@pytest.fixture(scope="module")
def g1000() -> Gaussians:
    return random_gaussians(1000)


@pytest.fixture(scope="module")
def ply1000(g1000: Gaussians) -> bytes:
    return to_ply_bytes(g1000)


@pytest.fixture(scope="module")
def splat1000(g1000: Gaussians) -> bytes:
    return to_splat_bytes(g1000)


# --------------------------------------------------------------------------- .ply writer


@pytest.mark.parametrize("n", [0, 1, 1000])
def test_ply_header_is_exact_and_body_is_68_bytes_per_row(n: int) -> None:
    """The header is byte-for-byte the 3DGS layout and the body is 17 float32 per vertex."""
    data = to_ply_bytes(random_gaussians(n))
    header = expected_header(n)
    assert data[: len(header)] == header
    assert len(data) == len(header) + 68 * n


@pytest.mark.parametrize("n", [0, 1, 1000])
def test_ply_reads_back_through_plyfile_bit_for_bit(n: int) -> None:
    """plyfile reads every property back exactly equal to the source tensors; normals are 0."""
    g = random_gaussians(n)
    ply = PlyData.read(BytesIO(to_ply_bytes(g)))
    assert [e.name for e in ply.elements] == ["vertex"]
    vertex = ply["vertex"]
    assert vertex.count == n
    assert tuple(p.name for p in vertex.properties) == PLY_PROPERTIES
    assert all(vertex[name].dtype == np.dtype("<f4") for name in PLY_PROPERTIES)
    expected = {
        "x": as_f32(g.means[:, 0]),
        "y": as_f32(g.means[:, 1]),
        "z": as_f32(g.means[:, 2]),
        "nx": np.zeros(n, np.float32),
        "ny": np.zeros(n, np.float32),
        "nz": np.zeros(n, np.float32),
        "opacity": as_f32(g.opacity_logits),
    }
    for i in range(3):
        expected[f"f_dc_{i}"] = as_f32(g.sh_dc[:, i])
        expected[f"scale_{i}"] = as_f32(g.log_scales[:, i])
    for i in range(4):
        expected[f"rot_{i}"] = as_f32(g.rotations[:, i])
    for name in PLY_PROPERTIES:
        got = np.asarray(vertex[name], dtype=np.float32)
        assert np.array_equal(got.view(np.uint32), expected[name].view(np.uint32)), name


def test_ply_accepts_tensors_that_require_grad_and_other_dtypes() -> None:
    """Tensors with grad or in float64 are detached and written as float32."""
    g = random_gaussians(10)
    g64 = Gaussians(
        g.means.double().requires_grad_(),
        g.log_scales.double(),
        g.rotations.double(),
        g.opacity_logits.double(),
        g.sh_dc.double(),
    )
    assert to_ply_bytes(g64) == to_ply_bytes(g)
    assert to_splat_bytes(g64) == to_splat_bytes(g)


def test_verify_ply_accepts_the_writers_output(ply1000: bytes) -> None:
    """A file from to_ply_bytes verifies, with its count and properties reported."""
    info = verify_ply(ply1000, expected_count=1000)
    assert info == PlyInfo(count=1000, properties=PLY_PROPERTIES)
    assert verify_ply(to_ply_bytes(random_gaussians(0))) == PlyInfo(0, PLY_PROPERTIES)


# --------------------------------------------------------------------------- .splat writer


@pytest.mark.parametrize("n", [0, 1, 1000])
def test_splat_size_is_32_bytes_per_gaussian(n: int) -> None:
    """A .splat has no header: exactly 32 bytes per Gaussian, and it verifies."""
    data = to_splat_bytes(random_gaussians(n))
    assert len(data) == SPLAT_ROW_BYTES * n
    assert verify_splat(data, expected_count=n) == n


def test_splat_rows_are_sorted_by_descending_volume_times_opacity(
    g1000: Gaussians, splat1000: bytes
) -> None:
    """Rows come out in the stable descending order of exp(s0+s1+s2) * sigmoid(opacity)."""
    order = expected_order(g1000)
    decoded = from_splat_bytes(splat1000)
    assert np.array_equal(decoded["positions"], as_f32(g1000.means)[order])
    volume = np.prod(decoded["scales"].astype(np.float64), axis=1)
    key = volume * sigmoid64(as_f32(g1000.opacity_logits).astype(np.float64)[order])
    assert np.all(np.diff(key) <= 0.0)


def test_splat_sort_is_stable_for_ties() -> None:
    """Gaussians with equal volume x opacity keep their input order."""
    n = 5
    g = Gaussians(
        means=torch.arange(n * 3, dtype=torch.float32).reshape(n, 3),
        log_scales=torch.full((n, 3), -2.0),
        rotations=torch.tensor([[1.0, 0.0, 0.0, 0.0]]).repeat(n, 1),
        opacity_logits=torch.zeros(n),
        sh_dc=torch.zeros(n, 3),
    )
    decoded = from_splat_bytes(to_splat_bytes(g))
    assert np.array_equal(decoded["positions"], as_f32(g.means))


def test_splat_scales_are_linear_within_float32(g1000: Gaussians, splat1000: bytes) -> None:
    """Scales are exp(log_scales), accurate to float32 precision."""
    order = expected_order(g1000)
    decoded = from_splat_bytes(splat1000)
    expected = np.exp(as_f32(g1000.log_scales).astype(np.float64))[order]
    np.testing.assert_allclose(decoded["scales"], expected, rtol=2e-7, atol=0.0)
    assert decoded["scales"].dtype == np.float32


def test_splat_colours_are_quantised_to_nearest(g1000: Gaussians, splat1000: bytes) -> None:
    """RGB is round(clip(0.5 + C0*f_dc) * 255) and alpha round(sigmoid(opacity) * 255)."""
    order = expected_order(g1000)
    rgba = from_splat_bytes(splat1000)["rgba"]
    assert rgba.dtype == np.uint8
    rgb = np.clip(0.5 + SH_C0 * as_f32(g1000.sh_dc).astype(np.float64), 0.0, 1.0)[order]
    alpha = sigmoid64(as_f32(g1000.opacity_logits).astype(np.float64))[order]
    assert np.array_equal(rgba[:, :3], np.rint(rgb * 255.0).astype(np.uint8))
    assert np.array_equal(rgba[:, 3], np.rint(alpha * 255.0).astype(np.uint8))
    bound = 0.5 / 255.0 + 1e-6
    assert np.all(np.abs(rgba[:, :3] / 255.0 - rgb) <= bound)
    assert np.all(np.abs(rgba[:, 3] / 255.0 - alpha) <= bound)
    # the random set exercises both clipping ends
    assert (rgba[:, :3] == 0).any()
    assert (rgba[:, :3] == 255).any()


def test_splat_rotation_is_within_quantisation_of_unit_quaternion(
    g1000: Gaussians, splat1000: bytes
) -> None:
    """Rotation bytes decode to the normalised (w,x,y,z) quaternion within 1/128."""
    order = expected_order(g1000)
    rot = from_splat_bytes(splat1000)["rotations"]
    q = as_f32(g1000.rotations).astype(np.float64)[order]
    q_unit = q / np.linalg.norm(q, axis=1, keepdims=True)
    assert np.all(np.abs((rot.astype(np.float64) - 128.0) / 128.0 - q_unit) <= 1.0 / 128.0 + 1e-9)
    assert np.array_equal(rot, np.clip(np.rint(q_unit * 128.0 + 128.0), 0, 255).astype(np.uint8))


def test_splat_zero_quaternion_is_written_as_identity() -> None:
    """A zero rotation has no direction; it is written as the identity, not NaN bytes."""
    g = random_gaussians(1)
    g = Gaussians(g.means, g.log_scales, torch.zeros(1, 4), g.opacity_logits, g.sh_dc)
    rot = from_splat_bytes(to_splat_bytes(g))["rotations"]
    assert rot.tolist() == [[255, 128, 128, 128]]


# --------------------------------------------------------------------------- verify_ply


def _replace(old: bytes, new: bytes) -> Callable[[bytes], bytes]:
    def mutate(data: bytes) -> bytes:
        assert old in data
        return data.replace(old, new, 1)

    return mutate


def _nan_at(row: int, prop: str) -> Callable[[bytes], bytes]:
    def mutate(data: bytes) -> bytes:
        body_start = data.index(b"end_header\n") + len(b"end_header\n")
        body = np.frombuffer(data[body_start:], dtype="<f4").reshape(-1, 17).copy()
        body[row, PLY_PROPERTIES.index(prop)] = np.nan
        return data[:body_start] + body.tobytes()

    return mutate


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        pytest.param(lambda d: d[:-1], r"body is 67999 bytes, expected 68000", id="truncated"),
        pytest.param(lambda d: d + b"\0" * 4, r"body is 68004 bytes", id="trailing-bytes"),
        pytest.param(
            _replace(
                b"property float x\nproperty float y\n", b"property float y\nproperty float x\n"
            ),
            r"properties are \['y', 'x'",
            id="wrong-order",
        ),
        pytest.param(
            _replace(b"property float opacity\n", b"property double opacity\n"),
            r"every property must be 'property float NAME'.*double opacity",
            id="double-property",
        ),
        pytest.param(
            _replace(b"end_header\n", b"element face 0\nproperty list uchar int vi\nend_header\n"),
            r"extra element 'element face 0'",
            id="extra-element",
        ),
        pytest.param(_nan_at(417, "scale_1"), r"row 417 property scale_1 is nan", id="nan"),
        pytest.param(
            _replace(b"format binary_little_endian 1.0", b"format ascii 1.0"),
            r"format line must be .*got 'format ascii 1.0'",
            id="ascii-format",
        ),
        pytest.param(
            _replace(b"format binary_little_endian 1.0", b"format binary_big_endian 1.0"),
            r"format line must be",
            id="big-endian",
        ),
        pytest.param(
            _replace(b"property float rot_3\n", b""), r"properties are .*expected", id="missing"
        ),
        pytest.param(_replace(b"1.0\n", b"1.0\r\n"), r"CR line endings", id="crlf"),
        pytest.param(lambda d: b"plx" + d[3:], r"magic", id="bad-magic"),
        pytest.param(_replace(b"end_header\n", b"end_headr\n"), r"no 'end_header'", id="no-end"),
        pytest.param(
            _replace(b"element vertex 1000\n", b"element vertex -5\n"),
            r"bad vertex count",
            id="negative-count",
        ),
    ],
)
def test_verify_ply_rejects_malformed_files(
    ply1000: bytes, mutate: Callable[[bytes], bytes], match: str
) -> None:
    """Each kind of damage raises ArtifactInvalid with a message naming the problem."""
    with pytest.raises(ArtifactInvalid, match=match) as info:
        verify_ply(mutate(ply1000))
    assert info.value.code == "ARTIFACT_INVALID"


def test_verify_ply_ignores_comment_lines(ply1000: bytes) -> None:
    """Standard 'comment' lines (as other PLY tools write) do not make a file invalid."""
    data = ply1000.replace(b"element vertex", b"comment made by another tool\nelement vertex", 1)
    assert verify_ply(data).count == 1000


def test_verify_ply_rejects_count_mismatch(ply1000: bytes) -> None:
    """A valid file whose vertex count differs from expected_count is rejected."""
    with pytest.raises(ArtifactInvalid, match=r"holds 1000 Gaussians, expected 999"):
        verify_ply(ply1000, expected_count=999)


def test_artifact_invalid_is_a_permanent_value_error() -> None:
    """ArtifactInvalid is a ValueError and classifies as permanent with its stable code."""
    exc = ArtifactInvalid("bad")
    assert isinstance(exc, ValueError)
    assert isinstance(exc, PermanentError)
    info = classify(exc)
    assert (info.code, info.message, info.retryable) == ("ARTIFACT_INVALID", "bad", False)


# --------------------------------------------------------------------------- verify_splat


def _splat_rows(data: bytes) -> npt.NDArray[np.void]:
    dtype = np.dtype(
        [
            ("position", "<f4", (3,)),
            ("scale", "<f4", (3,)),
            ("rgba", "u1", (4,)),
            ("rot", "u1", (4,)),
        ]
    )
    return np.frombuffer(data, dtype=dtype).copy()


def test_verify_splat_rejects_size_not_multiple_of_32(splat1000: bytes) -> None:
    """33 bytes (or any size not a multiple of 32) is not a .splat."""
    with pytest.raises(ArtifactInvalid, match="size 33 is not a multiple of 32"):
        verify_splat(splat1000[:33])
    with pytest.raises(ArtifactInvalid, match="not a multiple of 32"):
        from_splat_bytes(splat1000[:-1])


def test_verify_splat_rejects_nan_position(splat1000: bytes) -> None:
    """A NaN position is rejected with its row named."""
    rows = _splat_rows(splat1000)
    rows["position"][12, 1] = np.nan
    with pytest.raises(ArtifactInvalid, match="non-finite position: row 12 property y"):
        verify_splat(rows.tobytes())


@pytest.mark.parametrize("value", [0.0, -0.5, np.inf, np.nan])
def test_verify_splat_rejects_non_positive_or_non_finite_scale(
    splat1000: bytes, value: float
) -> None:
    """Scales must be finite and strictly positive."""
    rows = _splat_rows(splat1000)
    rows["scale"][7, 2] = value
    with pytest.raises(ArtifactInvalid, match=r"row 7 (property )?scale_2"):
        verify_splat(rows.tobytes())


def test_verify_splat_rejects_count_mismatch(splat1000: bytes) -> None:
    """A .splat with a different Gaussian count than expected is rejected."""
    with pytest.raises(ArtifactInvalid, match="holds 1000 Gaussians, expected 1001"):
        verify_splat(splat1000, expected_count=1001)


# --------------------------------------------------------------------------- verify_png


@pytest.fixture(scope="module")
def png_bytes() -> bytes:
    rng = np.random.default_rng(7)
    pixels = rng.integers(0, 256, size=(48, 64, 3), dtype=np.uint8)  # noise: a real IDAT
    buf = BytesIO()
    Image.fromarray(pixels, "RGB").save(buf, format="PNG")
    return buf.getvalue()


def test_verify_png_accepts_pillow_png(png_bytes: bytes) -> None:
    """A PNG written by Pillow verifies and reports (width, height)."""
    assert verify_png(png_bytes) == (64, 48)
    assert verify_png(png_bytes, width=64, height=48) == (64, 48)


def test_verify_png_rejects_random_bytes() -> None:
    """Bytes without the PNG signature are rejected."""
    junk = np.random.default_rng(3).integers(0, 256, size=4096, dtype=np.uint8).tobytes()
    with pytest.raises(ArtifactInvalid, match="signature"):
        verify_png(junk)


def test_verify_png_rejects_truncated_png(png_bytes: bytes) -> None:
    """A PNG cut short does not decode and is rejected."""
    with pytest.raises(ArtifactInvalid, match="does not decode"):
        verify_png(png_bytes[: len(png_bytes) // 2])


def test_verify_png_rejects_wrong_size(png_bytes: bytes) -> None:
    """A PNG of a different width or height than asked for is rejected."""
    with pytest.raises(ArtifactInvalid, match=r"PNG is 64x48, expected 32x48"):
        verify_png(png_bytes, width=32, height=48)
    with pytest.raises(ArtifactInvalid, match=r"expected \*x47"):
        verify_png(png_bytes, height=47)
