"""Photo-like sample inputs with a known answer: the procedural figure (samples.py) placed on
a gradient, textured or tiled backdrop, centred, off-centre or small, with sensor noise, a
soft shadow and vignetting -- and the true object mask -- for the foreground benchmark and
tests (bench/input_quality.py).

Deterministic from the scene's fields; pure numpy and Pillow, no file access.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from PIL import Image

# mypy takes the samples/ data folder beside samples.py for a namespace package
from splatq.services.gpu_worker.samples import sample_image  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Scene:
    """One generated photo: `backdrop` is gradient, texture or tiles; the object's centre
    (cx, cy) and height are fractions of the frame."""

    name: str
    backdrop: str
    width: int = 1600
    height: int = 1200
    cx: float = 0.5
    cy: float = 0.5
    object_height: float = 0.7
    seed: int = 0


# The benchmark's fixed set: every backdrop, the object centred, off-centre and small.
SCENES: tuple[Scene, ...] = (
    Scene("gradient-centred", "gradient", seed=1),
    Scene("gradient-small", "gradient", cx=0.62, cy=0.58, object_height=0.3, seed=2),
    Scene("texture-centred", "texture", seed=3),
    Scene("texture-off-centre", "texture", cx=0.33, cy=0.6, object_height=0.55, seed=4),
    Scene("texture-small", "texture", cx=0.7, cy=0.35, object_height=0.28, seed=5),
    Scene("tiles-centred", "tiles", seed=6),
    Scene("tiles-off-centre", "tiles", cx=0.65, cy=0.45, object_height=0.5, seed=7),
)


def render_scene(scene: Scene) -> tuple[Image.Image, np.ndarray]:
    """(RGB photo, [H, W] bool true object mask) of `scene`."""
    rng = np.random.default_rng(1000 + scene.seed)
    h, w = scene.height, scene.width
    backdrop = _BACKDROPS[scene.backdrop](rng, h, w)
    side = max(8, round(scene.object_height * h))
    figure = _figure(side, scene.seed)
    x0 = round(scene.cx * w - side / 2)
    y0 = round(scene.cy * h - side / 2)
    alpha = np.zeros((h, w))
    colour = np.zeros((h, w, 3))
    ys, xs = slice(max(0, y0), min(h, y0 + side)), slice(max(0, x0), min(w, x0 + side))
    fy, fx = slice(ys.start - y0, ys.stop - y0), slice(xs.start - x0, xs.stop - x0)
    alpha[ys, xs] = figure[fy, fx, 3]
    colour[ys, xs] = figure[fy, fx, :3]
    shadow = _shadow(alpha, side)
    lit = backdrop * (1.0 - 0.35 * shadow[..., None])
    photo = colour * alpha[..., None] + lit * (1.0 - alpha[..., None])
    photo = photo * _vignette(h, w)[..., None] + rng.normal(0.0, 2.0 / 255, (h, w, 3))
    pixels = np.clip(photo * 255.0 + 0.5, 0, 255).astype(np.uint8)
    return Image.fromarray(pixels), alpha > 0.5


# The figure is drawn at most this size (4x supersampled, numpy: seconds beyond) and enlarged.
_DRAW_SIDE = 192


@functools.cache
def _drawn(side: int, seed: int) -> Image.Image:
    drawn: Image.Image = sample_image(side, seed=seed)
    return drawn


def _figure(side: int, seed: int) -> np.ndarray:
    """[side, side, 4] float straight-alpha RGBA of the sample figure."""
    drawn = _drawn(min(side, _DRAW_SIDE), seed)
    if drawn.width != side:
        # Enlarged premultiplied, so the edge colours do not pick up the transparent black.
        premultiplied = drawn.convert("RGBa").resize((side, side), Image.Resampling.BICUBIC)
        drawn = premultiplied.convert("RGBA")
    return np.asarray(drawn, dtype=np.float64) / 255.0


def _shadow(alpha: np.ndarray, side: int) -> np.ndarray:
    """A soft contact shadow: the silhouette shifted down-right and blurred."""
    shift = max(1, side // 30)
    moved = np.zeros_like(alpha)
    moved[shift:, shift:] = alpha[:-shift, :-shift]
    small = Image.fromarray((moved * 255).astype(np.uint8))
    blurred = small.resize(
        (max(1, small.width // 8), max(1, small.height // 8)), Image.Resampling.BILINEAR
    )
    out: np.ndarray = np.asarray(blurred.resize(small.size, Image.Resampling.BILINEAR), np.float64)
    return out / 255.0


def _vignette(h: int, w: int) -> np.ndarray:
    y, x = np.mgrid[0:h, 0:w]
    r2 = ((x - w / 2) / (w / 2)) ** 2 + ((y - h / 2) / (h / 2)) ** 2
    return np.asarray(1.0 - 0.12 * r2 / 2, np.float64)


def _gradient(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    top, bottom = rng.uniform(0.35, 0.9, 3), rng.uniform(0.2, 0.75, 3)
    t = np.linspace(0.0, 1.0, h)[:, None, None]
    return np.broadcast_to(top * (1 - t) + bottom * t, (h, w, 3)).copy()


def _smooth_noise(rng: np.random.Generator, h: int, w: int, cells: int) -> np.ndarray:
    """[h, w] in [0, 1]: random values on a coarse grid, bicubically enlarged."""
    grid = (rng.uniform(0, 255, (cells, max(2, cells * w // h)))).astype(np.uint8)
    enlarged = Image.fromarray(grid).resize((w, h), Image.Resampling.BICUBIC)
    return np.asarray(enlarged, np.float64) / 255


def _texture(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """Wood-like grain: bands along a warped coordinate, two colours, blotches."""
    y, x = np.mgrid[0:h, 0:w] / max(h, w)
    warp = _smooth_noise(rng, h, w, 6)
    grain = 0.5 + 0.5 * np.sin(2 * np.pi * (14 * (y + 0.3 * x) + 3.0 * warp))
    fine = _smooth_noise(rng, h, w, 60)
    light, dark = rng.uniform(0.45, 0.85, 3), rng.uniform(0.15, 0.5, 3)
    mix = np.clip(0.7 * grain + 0.3 * fine, 0, 1)[..., None]
    return np.asarray(light * mix + dark * (1 - mix), np.float64)


def _tiles(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """A checked tablecloth: two colours, soft edges, a weave."""
    y, x = np.mgrid[0:h, 0:w] / max(h, w)
    period = rng.uniform(0.06, 0.1)
    check = (np.sin(2 * np.pi * x / period) * np.sin(2 * np.pi * y / period) > 0)[..., None]
    a, b = rng.uniform(0.5, 0.95, 3), rng.uniform(0.1, 0.55, 3)
    weave = 0.92 + 0.08 * np.sin(2 * np.pi * (x + y) * 180)[..., None]
    return np.asarray(np.where(check, a, b) * weave, np.float64)


_BACKDROPS = {"gradient": _gradient, "texture": _texture, "tiles": _tiles}
