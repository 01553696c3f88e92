"""The builtin silhouette-inflation model and the pure-torch EWA renderer, on CPU: the input
view is reproduced, turned views show real depth, batches do not mix, and splats land where
the projection says."""

from __future__ import annotations

import io
import math
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from splatq.services.gpu_worker import renderer
from splatq.services.gpu_worker.builtin_model import (
    SilhouetteInflationModel,
    edge_distance,
    foreground_mask,
)
from splatq.services.gpu_worker.camera import OBJECT_DISTANCE, Camera
from splatq.services.gpu_worker.gaussians import SH_C0, Gaussians
from splatq.services.gpu_worker.model import load_model
from splatq.services.gpu_worker.renderer import psnr, render, to_png_bytes
from splatq.services.gpu_worker.samples import (
    BUNDLED_SAMPLE,
    DEFAULT_BACKGROUND,
    sample_image,
    sample_image_rgb,
)

PREVIEW = 128
WHITE = (1.0, 1.0, 1.0)
BLACK = (0.0, 0.0, 0.0)
# 25 dB is an RMS error of 10^(-25/20) = 5.6% of full scale. Every Gaussian takes its colour
# from its own pixel, so the only differences left are splat blending between neighbours
# (texture edges, the anti-aliased rim); a wrong depth, colour or pixel mapping costs far more.
MIN_INPUT_VIEW_PSNR = 25.0


def as_tensor(image: Image.Image) -> torch.Tensor:
    """[4, R, R] float RGBA in [0, 1], as the worker feeds the model."""
    array = np.asarray(image.convert("RGBA"), dtype=np.float32) / 255.0
    return torch.from_numpy(array).permute(2, 0, 1).contiguous()


@pytest.fixture(scope="module")
def model() -> SilhouetteInflationModel:
    m = SilhouetteInflationModel()
    m.load(torch.device("cpu"))
    return m


@pytest.fixture(scope="module")
def rgba_sample() -> torch.Tensor:
    return as_tensor(sample_image(PREVIEW, seed=0))


@pytest.fixture(scope="module")
def sample_gaussians(model: SilhouetteInflationModel, rgba_sample: torch.Tensor) -> Gaussians:
    return model.infer(rgba_sample[None])[0]


def coverage(g: Gaussians, camera: Camera) -> tuple[torch.Tensor, torch.Tensor]:
    """(rendered opacity [H, W], image on white [H, W, 3]) from a white and a black render."""
    on_white = render(g, camera, WHITE)
    on_black = render(g, camera, BLACK)
    return 1.0 - (on_white - on_black).mean(-1), on_white


def centroid_x(weight: torch.Tensor) -> float:
    xs = torch.arange(weight.shape[1], dtype=torch.float32) + 0.5
    return float((weight * xs).sum() / weight.sum())


def test_interface_matches_the_protocol(model: SilhouetteInflationModel) -> None:
    """Resolutions are 128/512, other qualities are rejected, and the registry builds it."""
    assert model.input_resolution("preview") == 128
    assert model.input_resolution("full") == 512
    with pytest.raises(ValueError, match="quality"):
        model.input_resolution("ultra")
    camera = model.input_camera(128)
    assert (camera.width, camera.height, camera.fx) == (128, 128, Camera.input_view(128, 128).fx)
    assert model.version.startswith("builtin-")
    assert isinstance(load_model("builtin"), SilhouetteInflationModel)


def test_input_view_reproduces_the_rgba_sample(
    model: SilhouetteInflationModel, rgba_sample: torch.Tensor, sample_gaussians: Gaussians
) -> None:
    """Rendering from the input camera gives back the cut-out's foreground (>= 25 dB)."""
    alpha = rgba_sample[3]
    expected = (rgba_sample[:3] * alpha + (1.0 - alpha)).permute(1, 2, 0)  # over white
    image = render(sample_gaussians, model.input_camera(PREVIEW), WHITE)
    value = psnr(image, expected, mask=alpha > 0.5)
    print(f"input-view PSNR (RGBA sample, foreground): {value:.2f} dB")
    assert value >= MIN_INPUT_VIEW_PSNR


def test_input_view_reproduces_the_border_colour_sample(
    model: SilhouetteInflationModel, rgba_sample: torch.Tensor
) -> None:
    """Without alpha the object is found by the border colour and reproduced (>= 25 dB)."""
    image_in = as_tensor(sample_image_rgb(PREVIEW, seed=0))
    assert bool((image_in[3] == 1.0).all())
    truth = rgba_sample[3] > 0.5
    found = foreground_mask(image_in[None])[0]
    assert float((found & truth).sum() / (found | truth).sum()) > 0.95
    [g] = model.infer(image_in[None])
    image = render(g, model.input_camera(PREVIEW), DEFAULT_BACKGROUND)
    value = psnr(image, image_in[:3].permute(1, 2, 0), mask=truth)
    print(f"input-view PSNR (RGB sample, foreground): {value:.2f} dB")
    assert value >= MIN_INPUT_VIEW_PSNR


def test_turned_view_shows_parallax_from_real_depth(
    model: SilhouetteInflationModel, sample_gaussians: Gaussians
) -> None:
    """A 30-degree orbit differs from the front view and from a flat card at the same place:
    the inflated object keeps (or gains) silhouette area where a card would foreshorten."""
    camera = model.input_camera(PREVIEW)
    turned = camera.orbited(30)
    front_cov, front = coverage(sample_gaussians, camera)
    turned_cov, turned_img = coverage(sample_gaussians, turned)
    assert psnr(front, turned_img) < 20.0
    assert abs(centroid_x(turned_cov) - centroid_x(front_cov)) > 1.0

    g = sample_gaussians
    on_plane = g.means / g.means[:, 2:3] * OBJECT_DISTANCE  # same pixels, no depth
    card = Gaussians(on_plane, g.log_scales, g.rotations, g.opacity_logits, g.sh_dc)
    card_cov, card_img = coverage(card, turned)
    front_area, turned_area, card_area = (float(c.sum()) for c in (front_cov, turned_cov, card_cov))
    assert card_area < 0.98 * front_area  # the card foreshortens ...
    assert turned_area > front_area  # ... the inflated object shows its side
    assert psnr(turned_img, card_img) < 25.0


def test_front_and_back_surfaces_straddle_the_object_distance(sample_gaussians: Gaussians) -> None:
    """Half the Gaussians form a front sheet nearer than OBJECT_DISTANCE, half a back sheet."""
    z = sample_gaussians.means[:, 2]
    n = sample_gaussians.count
    assert n % 2 == 0
    assert bool((z[: n // 2] <= OBJECT_DISTANCE).all())
    assert bool((z[n // 2 :] >= OBJECT_DISTANCE).all())
    assert int((z > OBJECT_DISTANCE).sum()) > n // 3
    assert float(z.max()) > OBJECT_DISTANCE + 0.1


def test_batch_items_do_not_mix(model: SilhouetteInflationModel, rgba_sample: torch.Tensor) -> None:
    """Three different images in one batch give exactly what each gives alone."""
    images = torch.stack(
        [
            rgba_sample,
            torch.flip(rgba_sample, dims=[2]),
            as_tensor(sample_image_rgb(PREVIEW, seed=5)),
        ]
    )
    together = model.infer(images)
    assert len(together) == 3
    for image, g in zip(images, together, strict=True):
        [alone] = model.infer(image[None])
        assert g.count == alone.count > 0
        for name in ("means", "log_scales", "rotations", "opacity_logits", "sh_dc"):
            torch.testing.assert_close(getattr(g, name), getattr(alone, name))
    assert together[0].count != together[2].count


def test_full_frame_foreground_is_bounded_by_two_per_pixel(
    model: SilhouetteInflationModel,
) -> None:
    """A foreground covering every pixel gives at most 2 * 128^2 Gaussians (front + back)."""
    rng = np.random.default_rng(0)
    noise = torch.from_numpy(rng.random((3, PREVIEW, PREVIEW), dtype=np.float32))
    translucent = torch.cat([noise, torch.full((1, PREVIEW, PREVIEW), 0.9)])
    opaque = torch.cat([noise, torch.ones(1, PREVIEW, PREVIEW)])
    full, noisy = model.infer(torch.stack([translucent, opaque]))
    assert full.count == 2 * PREVIEW**2
    assert 0 < noisy.count <= 2 * PREVIEW**2


def test_empty_image_gives_no_gaussians_and_renders_background(
    model: SilhouetteInflationModel,
) -> None:
    """All-transparent and uniform opaque images give 0 Gaussians; those render as background."""
    transparent = torch.zeros(4, PREVIEW, PREVIEW)
    uniform = torch.cat([torch.full((3, PREVIEW, PREVIEW), 0.3), torch.ones(1, PREVIEW, PREVIEW)])
    results = model.infer(torch.stack([transparent, uniform]))
    assert [g.count for g in results] == [0, 0]
    image = render(results[0], model.input_camera(PREVIEW), (0.2, 0.4, 0.6))
    assert image.shape == (PREVIEW, PREVIEW, 3)
    expected = torch.tensor([0.2, 0.4, 0.6]).expand(PREVIEW, PREVIEW, 3)
    assert torch.equal(image, expected)


def test_edge_distance_is_the_exact_euclidean_distance_to_the_edge() -> None:
    """The batched distance transform equals brute force: half a pixel short of the nearest
    background pixel centre (the frame counts as background), 0 off the object."""
    size = 40
    ys, xs = torch.meshgrid(torch.arange(size) + 0.5, torch.arange(size) + 0.5, indexing="ij")
    disc = (xs - 20) ** 2 + (ys - 22) ** 2 <= 15.0**2
    blob = disc & ~((xs > 16) & (xs < 24) & (ys < 14)) | ((ys > 30) & (xs > 3))
    dist = edge_distance(torch.stack([blob, torch.zeros_like(blob)]))
    # Background: every non-object pixel plus a one-pixel ring outside the frame.
    grid = torch.arange(-1, size + 1, dtype=torch.float32) + 0.5
    by, bx = torch.meshgrid(grid, grid, indexing="ij")
    background = torch.nn.functional.pad(~blob, (1, 1, 1, 1), value=True)
    bg_points = torch.stack([bx[background], by[background]], -1)
    points = torch.stack([xs[blob], ys[blob]], -1)
    brute = torch.cdist(points, bg_points).amin(dim=1) - 0.5
    torch.testing.assert_close(dist[0][blob], brute)
    assert float(dist[0][~blob].abs().sum()) == 0.0
    assert float(dist[1].abs().sum()) == 0.0


def single_gaussian(mean: tuple[float, float, float], angle: float) -> Gaussians:
    """One black, half-transparent, anisotropic Gaussian turned by `angle` about the z axis."""
    return Gaussians(
        means=torch.tensor([mean]),
        log_scales=torch.log(torch.tensor([[0.15, 0.06, 0.01]])),
        rotations=torch.tensor([[math.cos(angle / 2), 0.0, 0.0, math.sin(angle / 2)]]),
        opacity_logits=torch.zeros(1),  # sigmoid(0) = 0.5, so alpha never clips at 0.99
        sh_dc=torch.full((1, 3), -0.5 / SH_C0),  # rgb 0
    )


def test_single_gaussian_is_an_ellipse_at_its_projection() -> None:
    """A lone splat's weight image is centred on its projection (0.5 px) and has the
    analytic EWA covariance J R S S^T R^T J^T + 0.3 I (within 10%)."""
    camera = Camera.input_view(64, 64)
    mean, angle = (0.1, -0.05, 2.0), math.radians(30)
    image = render(single_gaussian(mean, angle), camera, WHITE)
    weight = 1.0 - image[..., 0]  # black on white: exactly alpha
    ys, xs = torch.meshgrid(torch.arange(64) + 0.5, torch.arange(64) + 0.5, indexing="ij")
    total = weight.sum()
    cx, cy = float((weight * xs).sum() / total), float((weight * ys).sum() / total)
    x, y, z = mean
    assert abs(cx - (camera.fx * x / z + camera.cx)) < 0.5
    assert abs(cy - (camera.fy * y / z + camera.cy)) < 0.5

    c, s = math.cos(angle), math.sin(angle)
    rot = torch.tensor([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]], dtype=torch.float64)
    cov3 = rot @ torch.diag(torch.tensor([0.15, 0.06, 0.01], dtype=torch.float64) ** 2) @ rot.T
    jac = torch.tensor(
        [[camera.fx / z, 0.0, -camera.fx * x / z**2], [0.0, camera.fy / z, -camera.fy * y / z**2]],
        dtype=torch.float64,
    )
    expected = jac @ cov3 @ jac.T + 0.3 * torch.eye(2, dtype=torch.float64)
    dx, dy = xs - cx, ys - cy
    measured = torch.tensor(
        [
            [float((weight * dx * dx).sum() / total), float((weight * dx * dy).sum() / total)],
            [float((weight * dx * dy).sum() / total), float((weight * dy * dy).sum() / total)],
        ],
        dtype=torch.float64,
    )
    assert float((measured - expected).abs().max()) < 0.1 * float(expected.abs().max())
    assert float(weight.max()) <= 0.5 + 1e-6


def reference_render(g: Gaussians, camera: Camera) -> torch.Tensor:
    """Untiled per-Gaussian compositing over every pixel (the renderer's maths, no binning)."""
    rot_wc, t = camera.world_to_camera[:3, :3], camera.world_to_camera[:3, 3]
    means = g.means @ rot_wc.T + t
    q = g.rotations / g.rotations.norm(dim=-1, keepdim=True)
    ys, xs = torch.meshgrid(
        torch.arange(camera.height) + 0.5, torch.arange(camera.width) + 0.5, indexing="ij"
    )
    colour = torch.zeros(camera.height, camera.width, 3)
    trans = torch.ones(camera.height, camera.width)
    for i in torch.argsort(means[:, 2]).tolist():
        x, y, z = means[i].tolist()
        w, qx, qy, qz = q[i].tolist()
        r = torch.tensor(
            [
                [1 - 2 * (qy * qy + qz * qz), 2 * (qx * qy - w * qz), 2 * (qx * qz + w * qy)],
                [2 * (qx * qy + w * qz), 1 - 2 * (qx * qx + qz * qz), 2 * (qy * qz - w * qx)],
                [2 * (qx * qz - w * qy), 2 * (qy * qz + w * qx), 1 - 2 * (qx * qx + qy * qy)],
            ]
        )
        m = rot_wc @ r @ torch.diag(g.log_scales[i].exp())
        jac = torch.tensor(
            [
                [camera.fx / z, 0.0, -camera.fx * x / z**2],
                [0.0, camera.fy / z, -camera.fy * y / z**2],
            ]
        )
        cov = jac @ m @ m.T @ jac.T + 0.3 * torch.eye(2)
        conic = torch.linalg.inv(cov)
        dx = xs - (camera.fx * x / z + camera.cx)
        dy = ys - (camera.fy * y / z + camera.cy)
        power = -0.5 * (conic[0, 0] * dx * dx + 2 * conic[0, 1] * dx * dy + conic[1, 1] * dy * dy)
        alpha = (torch.sigmoid(g.opacity_logits[i]) * power.exp()).clamp(max=0.99)
        alpha = torch.where(alpha >= 1 / 255, alpha, 0.0)
        colour += (trans * alpha)[..., None] * g.rgb[i]
        trans = trans * (1 - alpha)
    return colour + trans[..., None]  # white background


@pytest.mark.parametrize("tile_size", [8, 16])
def test_tiled_render_matches_an_untiled_reference(tile_size: int) -> None:
    """Binning into tiles, depth sorting and chunked compositing change nothing visible."""
    gen = torch.Generator().manual_seed(3)
    n = 60
    means = torch.cat(
        [torch.rand(n, 2, generator=gen) * 0.8 - 0.4, 1.6 + torch.rand(n, 1, generator=gen)], 1
    )
    g = Gaussians(
        means=means,
        log_scales=torch.log(0.01 + 0.06 * torch.rand(n, 3, generator=gen)),
        rotations=torch.randn(n, 4, generator=gen),
        opacity_logits=torch.randn(n, generator=gen) * 2,
        sh_dc=(torch.rand(n, 3, generator=gen) - 0.5) / SH_C0,
    )
    camera = Camera.input_view(40, 36).orbited(20)
    image = render(g, camera, WHITE, tile_size=tile_size)
    # Tiles cut splats off beyond their 3-sigma box (as 3DGS does): a ~1% residue at most.
    assert float((image - reference_render(g, camera)).abs().max()) < 0.02


def test_png_and_psnr_helpers() -> None:
    """PNG bytes decode to the same 8-bit image; PSNR is inf when equal and honours the mask."""
    image = torch.rand(9, 7, 3)
    decoded = Image.open(io.BytesIO(to_png_bytes(image)))
    assert (decoded.mode, decoded.size) == ("RGB", (7, 9))
    back = torch.from_numpy(np.asarray(decoded, dtype=np.float32) / 255.0)
    assert float((back - image).abs().max()) <= 0.5 / 255 + 1e-6
    assert psnr(image, image) == math.inf
    noisy = image.clone()
    noisy[0] = 1 - noisy[0]
    mask = torch.ones(9, 7, dtype=torch.bool)
    mask[0] = False
    assert psnr(image, noisy, mask) == math.inf
    assert psnr(image, noisy) < 30


def test_samples_are_textured_cutouts_and_the_bundled_png_is_current() -> None:
    """The sample is an RGBA figure on transparency with many colours; the PNG matches it."""
    image = sample_image(256, seed=0)
    array = np.asarray(image)
    assert image.mode == "RGBA"
    assert array[0, 0, 3] == 0
    assert array[128, 128, 3] == 255
    opaque = array[array[..., 3] == 255][:, :3]
    assert len(np.unique(opaque // 16, axis=0)) > 50  # shaded and textured, not flat
    assert BUNDLED_SAMPLE.stat().st_size < 100_000
    assert np.array_equal(np.asarray(Image.open(BUNDLED_SAMPLE)), array)
    assert sample_image_rgb(64).mode == "RGB"


def test_full_quality_inference_and_render_time_is_reported(
    model: SilhouetteInflationModel,
) -> None:
    """A 512 px full-quality inference plus a turned render completes (timing printed only)."""
    image = as_tensor(sample_image(model.input_resolution("full"), seed=1))
    start = time.perf_counter()
    with torch.inference_mode():
        [g] = model.infer(image[None])
        inferred = time.perf_counter()
        out = render(g, model.input_camera(512).orbited(25))
    done = time.perf_counter()
    print(
        f"full quality: {g.count} Gaussians, infer {inferred - start:.2f} s, "
        f"render 512x512 {done - inferred:.2f} s"
    )
    assert out.shape == (512, 512, 3)


def test_the_cpu_tile_groups_render_the_image_the_large_ones_do(
    model: SilhouetteInflationModel, sample_gaussians: Gaussians, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the CPU a few tiles are composited at a time (issue #27: memory); the preview is
    the one the large groups (CUDA's) render: bit for bit on this sample."""
    camera = model.input_camera(PREVIEW).orbited(25)
    small = render(sample_gaussians, camera)
    monkeypatch.setattr(renderer, "CPU_GROUP_BUDGET", renderer.GROUP_BUDGET)
    large = render(sample_gaussians, camera)
    assert torch.equal(small, large)


# A preview render in a fresh process: its peak resident memory above the process before it
# (VmHWM, reset through /proc/self/clear_refs), in MB.
RENDER_PEAK = """
import io, torch
from splatq.services.gpu_worker.artifacts import render_preview
from splatq.services.gpu_worker import renderer
from splatq.services.gpu_worker.model import load_model
from splatq.services.gpu_worker.samples import sample_image
import numpy as np

def status(field):
    line = next(l for l in open("/proc/self/status") if l.startswith(field + ":"))
    return int(line.split()[1]) / 1024

m = load_model("builtin")
m.load(torch.device("cpu"))
rgba = np.asarray(sample_image(128, seed=0).convert("RGBA"), dtype=np.float32) / 255.0
image = torch.from_numpy(rgba).permute(2, 0, 1).contiguous()
with torch.inference_mode():
    [g] = m.infer(image[None])
before = status("VmRSS")
open("/proc/self/clear_refs", "w").write("5")
render_preview(g, m.input_camera(128))
print(round(status("VmHWM") - before))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_cpu_preview_render_peaks_at_tens_of_megabytes() -> None:
    """Issue #27: a CPU worker's malloc keeps about a render's peak per thread that rendered;
    with 16 MiB intermediates a preview's peak was ~350 MB, in groups of 8 tiles ~20 MB."""
    out = subprocess.run(
        [sys.executable, "-c", RENDER_PEAK], capture_output=True, text=True, timeout=120, check=True
    )
    peak = int(out.stdout.splitlines()[-1])
    print(f"preview render peak: +{peak} MB")
    assert peak < 100


SUBNORMAL = 1e-39  # below float32's smallest normal (~1.18e-38)


def to_8bit(image: torch.Tensor) -> torch.Tensor:
    return (image.clamp(0.0, 1.0) * 255.0).round().to(torch.uint8)


def _flushes_here() -> bool:
    """Whether this thread computes subnormal float32 values as zero right now."""
    return float(torch.tensor([SUBNORMAL], dtype=torch.float32)[0] * 1.0) == 0.0


def test_a_cpu_render_computes_with_subnormals_flushed_and_puts_the_thread_back(
    model: SilhouetteInflationModel, sample_gaussians: Gaussians, monkeypatch: pytest.MonkeyPatch
) -> None:
    """x86 computes subnormals in microcode: a CPU render that composited with them spent
    most of its time there (docs/benchmarks.md). The compositing runs flushed; the calling
    thread is as it was afterwards, and the image is the one an unflushed render makes."""
    assert not _flushes_here()
    seen: list[bool] = []
    composite = renderer._composite_group

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(_flushes_here())
        return composite(*args, **kwargs)

    monkeypatch.setattr(renderer, "_composite_group", spy)
    camera = model.input_camera(PREVIEW).orbited(25)
    flushed = render(sample_gaussians, camera)
    assert seen
    assert all(seen)
    assert not _flushes_here()
    unflushed = renderer._render(sample_gaussians, camera, (1.0, 1.0, 1.0), 16)
    assert torch.equal(to_8bit(flushed), to_8bit(unflushed))


def test_a_job_pool_thread_flushes_subnormals_for_good() -> None:
    """A job pool thread sets it at its start (handler.thread_setup), before its torch
    intra-op team exists, so the team inherits it; a direct render there leaves it on."""

    def in_a_pool_thread() -> bool:
        renderer.flush_denormals_in_this_thread()
        with renderer.denormals_flushed(torch.device("cpu")):
            pass
        return _flushes_here()

    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(in_a_pool_thread).result()
    assert not _flushes_here()
