""".spz: what the worker writes decodes through an independent reader (tests/gpu_worker/
spz_reader.py, written from the format's description) to the Gaussians within each field's
quantisation step; it is several times smaller than the .ply; the verifier rejects bad bytes."""

from __future__ import annotations

import gzip
import math
import struct

import numpy as np
import pytest
import torch

from splatq.services.gpu_worker.formats import ArtifactInvalid, to_ply_bytes
from splatq.services.gpu_worker.gaussians import Gaussians
from splatq.services.gpu_worker.spz import fractional_bits_for, to_spz_bytes, verify_spz
from tests.gpu_worker.spz_reader import read_spz
from tests.gpu_worker.test_formats import random_gaussians


@pytest.fixture(scope="module")
def g500() -> Gaussians:
    return random_gaussians(500)


def test_spz_decodes_independently_to_the_gaussians(g500: Gaussians) -> None:
    cloud = read_spz(to_spz_bytes(g500))
    assert cloud.version == 3
    assert cloud.fractional_bits == 12
    assert len(cloud.positions) == g500.count
    means = g500.means.numpy().astype(np.float64)
    # positions: 24-bit fixed point with 12 fractional bits -> within half a step
    assert np.abs(np.array(cloud.positions) - means).max() <= 0.5 / 4096 + 1e-9
    alpha = 1.0 / (1.0 + np.exp(-g500.opacity_logits.numpy().astype(np.float64)))
    assert np.abs(np.array(cloud.alphas) - alpha).max() <= 0.5 / 255 + 1e-9
    # colours: steps of 1/(0.15*255) in f_dc, clipped to the representable range
    dc = np.clip(g500.sh_dc.numpy().astype(np.float64), -127.5 / 38.25, 127.5 / 38.25)
    assert np.abs(np.array(cloud.colors) - dc).max() <= 0.5 / (0.15 * 255) + 1e-6
    assert np.abs(np.array(cloud.log_scales) - g500.log_scales.numpy()).max() <= 0.5 / 16 + 1e-6
    q = g500.rotations.numpy().astype(np.float64)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    dots = np.abs(np.sum(np.array(cloud.rotations) * q, axis=1))  # q and -q: the same rotation
    assert dots.min() > 0.9999


def test_spz_is_deterministic_and_much_smaller_than_the_ply(g500: Gaussians) -> None:
    data = to_spz_bytes(g500)
    assert data == to_spz_bytes(g500)  # no timestamp in the gzip header
    assert len(data) * 3 < len(to_ply_bytes(g500))
    assert verify_spz(data, expected_count=500) == 500


def test_spz_zero_quaternion_is_the_identity_and_far_points_lose_fraction_bits() -> None:
    g = random_gaussians(4)
    far = g.means.clone()
    far[0, 2] = 5000.0  # past 2048: 12 fraction bits would overflow 24 bits
    rotations = g.rotations.clone()
    rotations[1] = 0.0
    g = Gaussians(far, g.log_scales, rotations, g.opacity_logits, g.sh_dc)
    assert fractional_bits_for(g.means.numpy()) == 10
    cloud = read_spz(to_spz_bytes(g))
    assert cloud.fractional_bits == 10
    assert math.isclose(cloud.positions[0][2], 5000.0, abs_tol=1 / 1024)
    assert cloud.rotations[1] == pytest.approx((1.0, 0.0, 0.0, 0.0), abs=1e-6)


def test_spz_of_no_gaussians_is_valid() -> None:
    empty = Gaussians(torch.zeros(0, 3), torch.zeros(0, 3), torch.zeros(0, 4), torch.zeros(0),
                      torch.zeros(0, 3))  # fmt: skip
    assert verify_spz(to_spz_bytes(empty), expected_count=0) == 0


@pytest.mark.parametrize(
    ("name", "damage", "message"),
    [
        ("not gzip", lambda raw: raw, "not a gzip stream"),
        ("magic", lambda raw: gzip.compress(b"XXXX" + raw[4:]), "magic"),
        ("version", lambda raw: gzip.compress(raw[:4] + struct.pack("<I", 9) + raw[8:]), "version"),
        ("short", lambda raw: gzip.compress(raw[:-1]), "body is not"),
        ("long", lambda raw: gzip.compress(raw + b"\0"), "body is not"),
        ("header", lambda raw: gzip.compress(raw[:10]), "header"),
        ("truncated gzip", lambda raw: gzip.compress(raw)[:-12], "body is not"),
    ],
)
def test_verify_spz_rejects_damaged_bytes(g500: Gaussians, name: str, damage, message: str) -> None:  # type: ignore[no-untyped-def]
    raw = gzip.decompress(to_spz_bytes(g500))
    with pytest.raises(ArtifactInvalid, match=message):
        verify_spz(damage(raw), expected_count=500)


def test_verify_spz_checks_the_count(g500: Gaussians) -> None:
    with pytest.raises(ArtifactInvalid, match="holds 500"):
        verify_spz(to_spz_bytes(g500), expected_count=501)
