"""Pure-torch EWA splatting of `Gaussians` through a pinhole `Camera` (CPU or CUDA), plus PNG
encoding and PSNR for previews and tests.

No custom kernels and no numpy in the hot path; memory stays bounded by rendering groups of
tiles against fixed-size chunks of each tile's depth-sorted Gaussian list.
"""

from __future__ import annotations

import contextlib
import io
import math
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from PIL import Image

from splatq.services.gpu_worker.camera import Camera
from splatq.services.gpu_worker.gaussians import SH_C0, Gaussians

NEAR_Z = 0.01
# Screen-space low-pass added to every 2-D covariance (as 3DGS does): a Gaussian smaller than
# a pixel still covers about one pixel instead of aliasing away between pixel centres.
LOW_PASS = 0.3
MAX_ALPHA = 0.99  # as 3DGS: no single splat hides everything behind it completely
MIN_ALPHA = 1.0 / 255.0  # below one 8-bit step a splat cannot change the output
# Stop compositing a group of tiles once every pixel's remaining transmittance is below this.
T_EPSILON = 1e-4
# Elements of one [tiles, pixels, gaussians] intermediate (float32); a chunk step holds about
# ten of them, so a render's peak memory is bounded whatever the scene size. On CUDA ~16 MiB
# each (a few hundred MiB peak) keeps the kernels large. On the CPU a group of 8 tiles (2 MiB
# each) stays in cache: measured with subnormals flushed (2026-12-06, 2-core VM, builtin
# model), a preview render (128 px) peaks at +18 MB in 0.44 s against +352 MB in 0.55 s with
# CUDA's groups, a full one (512 px) at +4 MB in 3.6 s against +240 MB in 10 s. Since a CPU
# worker's allocator keeps about one such peak per thread that renders, this bounds its
# resident memory (docs/operations.md#memory).
GROUP_BUDGET = 1 << 22
CPU_GROUP_BUDGET = 1 << 19
CHUNK = 256  # Gaussians composited per step within every tile of a group


@dataclass(frozen=True)
class _Splats:
    """Screen-space Gaussians that survived culling, sorted front to back."""

    xy: torch.Tensor  # [M, 2] pixel coordinates (pixel centres at i + 0.5)
    conic: torch.Tensor  # [M, 3] inverse 2-D covariance (a, b, c)
    opacity: torch.Tensor  # [M]
    rgb: torch.Tensor  # [M, 3]
    tile_lo: torch.Tensor  # [M, 2] first tile (x, y) touched
    tile_hi: torch.Tensor  # [M, 2] last tile (x, y) touched, inclusive


@contextlib.contextmanager
def denormals_flushed(device: torch.device) -> Iterator[None]:
    """On the CPU, subnormal floats (below ~1.2e-38) read and computed as zero in this thread
    for the block. Compositing drives transmittance and the products of many `1 - alpha` far
    below that; x86 handles subnormals in microcode, and a CPU render spent most of its time
    there (a 512-px render: 72 s without, 18 s with, the same output to 8 bits). A pool
    thread that renders sets it for good at start (`flush_denormals_in_this_thread`, so the
    torch intra-op threads it creates later inherit it); this covers a direct call, and puts
    the thread back as it was (torch has no getter: this module keeps track)."""
    if device.type != "cpu" or getattr(_THREAD, "flushing", False):
        yield
        return
    if not torch.set_flush_denormal(True):
        yield  # not supported on this CPU: nothing to restore
        return
    try:
        yield
    finally:
        torch.set_flush_denormal(False)


_THREAD = threading.local()


def flush_denormals_in_this_thread() -> None:
    """For good in the calling thread (a job pool's thread, at its start): see
    `denormals_flushed`."""
    _THREAD.flushing = bool(torch.set_flush_denormal(True))


def render(
    g: Gaussians,
    camera: Camera,
    background: tuple[float, float, float] = (1.0, 1.0, 1.0),
    tile_size: int = 16,
) -> torch.Tensor:
    """[H, W, 3] float32 image in [0, 1] on the Gaussians' device."""
    with denormals_flushed(g.means.device):
        return _render(g, camera, background, tile_size)


def _render(
    g: Gaussians, camera: Camera, background: tuple[float, float, float], tile_size: int
) -> torch.Tensor:
    device = g.means.device
    height, width = camera.height, camera.width
    bg = torch.tensor(background, dtype=torch.float32, device=device)
    tiles_x = math.ceil(width / tile_size)
    tiles_y = math.ceil(height / tile_size)
    n_tiles = tiles_x * tiles_y
    pix = tile_size * tile_size

    splats = _project(g, camera, tile_size, tiles_x, tiles_y)
    tile_ids, gauss_ids = _tile_pairs(splats, tiles_x)
    per_tile = torch.bincount(tile_ids, minlength=n_tiles)
    starts = torch.cumsum(per_tile, 0) - per_tile

    # Pixel-centre coordinates of every tile, [n_tiles, pix, 2].
    local = torch.arange(tile_size, device=device, dtype=torch.float32) + 0.5
    ly, lx = torch.meshgrid(local, local, indexing="ij")
    tile_index = torch.arange(n_tiles, device=device)
    origin = torch.stack(
        [(tile_index % tiles_x) * tile_size, (tile_index // tiles_x) * tile_size], -1
    ).float()
    offsets = torch.stack([lx.reshape(-1), ly.reshape(-1)], -1)

    colour = torch.zeros(n_tiles, pix, 3, device=device)
    trans = torch.ones(n_tiles, pix, device=device)
    budget = GROUP_BUDGET if device.type == "cuda" else CPU_GROUP_BUDGET
    group = max(1, budget // (pix * CHUNK))
    counts_host = per_tile.tolist()
    for first in range(0, n_tiles, group):
        last = min(n_tiles, first + group)
        longest = max(counts_host[first:last])
        if longest == 0:
            continue
        sel = slice(first, last)
        pixels = origin[sel, None, :] + offsets[None]  # [G, P, 2]
        c, t = _composite_group(splats, gauss_ids, starts[sel], per_tile[sel], longest, pixels)
        colour[sel] = c
        trans[sel] = t

    image = colour + trans.unsqueeze(-1) * bg
    image = image.reshape(tiles_y, tiles_x, tile_size, tile_size, 3)
    image = image.permute(0, 2, 1, 3, 4).reshape(tiles_y * tile_size, tiles_x * tile_size, 3)
    return image[:height, :width].clamp(0.0, 1.0).contiguous()


def _project(g: Gaussians, camera: Camera, tile_size: int, tiles_x: int, tiles_y: int) -> _Splats:
    """EWA projection of every Gaussian; culls what is behind, off-screen or invisible."""
    device = g.means.device
    w2c = camera.world_to_camera.to(device=device, dtype=torch.float32)
    rot_wc, trans_wc = w2c[:3, :3], w2c[:3, 3]
    means = g.means.float() @ rot_wc.T + trans_wc
    x, y, z = means.unbind(-1)

    opacity = torch.sigmoid(g.opacity_logits.float())
    keep = (z > NEAR_Z) & (opacity >= MIN_ALPHA)

    q = g.rotations.float()
    q = q / q.norm(dim=-1, keepdim=True).clamp(min=1e-12)
    m = _quaternion_matrix(q) * torch.exp(g.log_scales.float()).unsqueeze(-2)  # R S
    cov_cam = rot_wc @ (m @ m.transpose(-1, -2)) @ rot_wc.T  # [N, 3, 3]

    zs = z.clamp(min=NEAR_Z)
    # Like 3DGS, evaluate the Jacobian no further off-axis than 1.3x the field of view: the
    # linearisation explodes for Gaussians far outside the frustum, which only blur the edge.
    lim_x = 1.3 * 0.5 * camera.width / camera.fx
    lim_y = 1.3 * 0.5 * camera.height / camera.fy
    tx = (x / zs).clamp(-lim_x, lim_x) * zs
    ty = (y / zs).clamp(-lim_y, lim_y) * zs
    zero = torch.zeros_like(zs)
    jac = torch.stack(
        [
            torch.stack([camera.fx / zs, zero, -camera.fx * tx / zs**2], -1),
            torch.stack([zero, camera.fy / zs, -camera.fy * ty / zs**2], -1),
        ],
        -2,
    )  # [N, 2, 3]
    cov2d = jac @ cov_cam @ jac.transpose(-1, -2)
    a = cov2d[:, 0, 0] + LOW_PASS
    b = cov2d[:, 0, 1]
    c = cov2d[:, 1, 1] + LOW_PASS
    det = a * c - b * b
    keep &= det > 0
    det = torch.where(keep, det, torch.ones_like(det))
    conic = torch.stack([c / det, -b / det, a / det], -1)
    mid = 0.5 * (a + c)
    lam_max = mid + torch.sqrt((mid * mid - det).clamp(min=0.1))
    radius = torch.ceil(3.0 * torch.sqrt(lam_max))

    u = camera.fx * x / zs + camera.cx
    v = camera.fy * y / zs + camera.cy
    keep &= (u + radius > 0) & (u - radius < camera.width)
    keep &= (v + radius > 0) & (v - radius < camera.height)

    # Front to back: pairs are later stably sorted by tile, which keeps this order per tile.
    idx = torch.nonzero(keep).squeeze(-1)
    idx = idx[torch.argsort(z[idx], stable=True)]
    xy = torch.stack([u, v], -1)[idx]
    r = radius[idx].unsqueeze(-1)
    tile_lo = torch.floor((xy - r) / tile_size).long()
    tile_hi = torch.floor((xy + r) / tile_size).long()
    limit = torch.tensor([tiles_x - 1, tiles_y - 1], device=device)
    return _Splats(
        xy=xy,
        conic=conic[idx],
        opacity=opacity[idx],
        rgb=(0.5 + SH_C0 * g.sh_dc.float()[idx]).clamp(0.0, 1.0),
        tile_lo=torch.minimum(tile_lo.clamp(min=0), limit),
        tile_hi=torch.minimum(tile_hi.clamp(min=0), limit),
    )


def _quaternion_matrix(q: torch.Tensor) -> torch.Tensor:
    """[N, 3, 3] rotation matrices of unit (w, x, y, z) quaternions."""
    w, x, y, z = q.unbind(-1)
    return torch.stack(
        [
            torch.stack([1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)], -1),
            torch.stack([2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)], -1),
            torch.stack([2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)], -1),
        ],
        -2,
    )


def _tile_pairs(splats: _Splats, tiles_x: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(tile id, splat index) for every tile each splat's 3-sigma box touches, grouped by
    tile and front to back within a tile."""
    device = splats.xy.device
    span = splats.tile_hi - splats.tile_lo + 1  # [M, 2]
    per_splat = span[:, 0] * span[:, 1]
    total = int(per_splat.sum())
    splat_ids = torch.repeat_interleave(torch.arange(per_splat.shape[0], device=device), per_splat)
    first = torch.cumsum(per_splat, 0) - per_splat
    k = torch.arange(total, device=device) - first[splat_ids]
    nx = span[splat_ids, 0]
    tx = splats.tile_lo[splat_ids, 0] + k % nx
    ty = splats.tile_lo[splat_ids, 1] + k // nx
    tile_ids = ty * tiles_x + tx
    order = torch.sort(tile_ids, stable=True).indices
    return tile_ids[order], splat_ids[order]


def _composite_group(
    splats: _Splats,
    gauss_ids: torch.Tensor,
    starts: torch.Tensor,
    counts: torch.Tensor,
    longest: int,
    pixels: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Front-to-back alpha compositing of a group of G tiles: ([G, P, 3] colour, [G, P]
    remaining transmittance). Each tile's list is walked in CHUNK-sized steps, padded to the
    longest list in the group, carrying transmittance between steps."""
    device = pixels.device
    n_groups, n_pix, _ = pixels.shape
    colour = torch.zeros(n_groups, n_pix, 3, device=device)
    trans = torch.ones(n_groups, n_pix, device=device)
    lane = torch.arange(CHUNK, device=device)
    px = pixels[..., 0].unsqueeze(-1)  # [G, P, 1]
    py = pixels[..., 1].unsqueeze(-1)
    for step in range(0, longest, CHUNK):
        pos = step + lane  # [C]
        valid = pos[None, :] < counts[:, None]  # [G, C]
        flat = (starts[:, None] + pos[None, :]).clamp(max=max(gauss_ids.shape[0] - 1, 0))
        ids = gauss_ids[flat]  # [G, C]
        xy = splats.xy[ids]  # [G, C, 2]
        conic = splats.conic[ids]  # [G, C, 3]
        opacity = torch.where(valid, splats.opacity[ids], torch.zeros_like(flat, dtype=px.dtype))
        dx = px - xy[:, None, :, 0]  # [G, P, C]
        dy = py - xy[:, None, :, 1]
        power = (
            -0.5 * (conic[:, None, :, 0] * dx * dx + conic[:, None, :, 2] * dy * dy)
            - conic[:, None, :, 1] * dx * dy
        )
        alpha = (opacity[:, None, :] * torch.exp(power.clamp(max=0.0))).clamp(max=MAX_ALPHA)
        alpha = torch.where(alpha >= MIN_ALPHA, alpha, torch.zeros_like(alpha))
        passed = torch.cumprod(1.0 - alpha, dim=-1)  # inclusive
        before = torch.cat([torch.ones_like(passed[..., :1]), passed[..., :-1]], dim=-1)
        weight = trans.unsqueeze(-1) * before * alpha  # [G, P, C]
        colour = colour + torch.bmm(weight, splats.rgb[ids])
        trans = trans * passed[..., -1]
        if bool((trans < T_EPSILON).all()):
            break
    return colour, trans


def to_png_bytes(image: torch.Tensor) -> bytes:
    """8-bit RGB PNG of an [H, W, 3] float image in [0, 1]."""
    if image.ndim != 3 or image.shape[-1] != 3:
        raise ValueError(f"expected [H, W, 3], got {tuple(image.shape)}")
    pixels = (image.detach().float().clamp(0.0, 1.0) * 255.0).round().to(torch.uint8).cpu()
    buffer = io.BytesIO()
    Image.fromarray(pixels.numpy()).save(buffer, format="PNG")
    return buffer.getvalue()


def psnr(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor | None = None) -> float:
    """Peak signal-to-noise ratio in dB of two [H, W, C] images in [0, 1], optionally only
    over the [H, W] bool `mask` (inf when identical, nan when the mask is empty)."""
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}")
    err = (a.float() - b.float().to(a.device)) ** 2
    if mask is not None:
        err = err[mask.to(a.device)]
    if err.numel() == 0:
        return math.nan
    mse = float(err.mean())
    return math.inf if mse == 0.0 else 10.0 * math.log10(1.0 / mse)
