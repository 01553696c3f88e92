"""Procedural sample inputs: a shaded, textured, multi-coloured figure on a transparent or a
plain background, for demos, smoke tests and the bundled `samples/sample.png`.

Deterministic from (size, seed); no randomness from the environment and no file access except
in `__main__`, which (re)writes the bundled PNG.
"""

from __future__ import annotations

import colorsys
from pathlib import Path

import numpy as np
from PIL import Image

SUPERSAMPLE = 4  # anti-aliased edges: draw at 4x and box-filter (premultiplied)
DEFAULT_BACKGROUND = (0.92, 0.93, 0.95)  # a light studio grey, unlike anything in the figure
LIGHT = np.array([-0.45, -0.55, 0.70])  # from upper left, towards the viewer
BUNDLED_SAMPLE = Path(__file__).with_name("samples") / "sample.png"


def sample_image(size: int = 256, seed: int = 0) -> Image.Image:
    """RGBA figure (body, arms, head with eyes, hat) on a fully transparent background."""
    return Image.fromarray(_to_uint8(_draw(size, seed)))


def sample_image_rgb(
    size: int = 256,
    seed: int = 0,
    background: tuple[float, float, float] = DEFAULT_BACKGROUND,
) -> Image.Image:
    """The same figure composited onto a plain `background` colour, without alpha (like a
    product photo), so the model must find the object by the border colour."""
    rgba = _draw(size, seed)
    alpha = rgba[..., 3:4]
    rgb = rgba[..., :3] * alpha + np.asarray(background, dtype=np.float64) * (1.0 - alpha)
    return Image.fromarray(_to_uint8(rgb))


def _to_uint8(a: np.ndarray) -> np.ndarray:
    return np.asarray(np.clip(a * 255.0 + 0.5, 0, 255), dtype=np.uint8)


def _hsv(h: float, s: float, v: float) -> np.ndarray:
    return np.asarray(colorsys.hsv_to_rgb(h % 1.0, s, v), dtype=np.float64)


class _Canvas:
    """Supersampled straight-colour canvas painted in order, later parts on top."""

    def __init__(self, n: int) -> None:
        coords = (np.arange(n, dtype=np.float64) + 0.5) / n * 2.0 - 1.0
        self.u, self.v = np.meshgrid(coords, coords, indexing="xy")  # x right, y down
        self.rgb = np.zeros((n, n, 3))
        self.alpha = np.zeros((n, n))

    def ellipse(self, cx: float, cy: float, rx: float, ry: float) -> _Part:
        return _Part(self, (self.u - cx) / rx, (self.v - cy) / ry)


class _Part:
    """One ellipse in its own normalised coordinates (px, py), shaded as a half-ellipsoid."""

    def __init__(self, canvas: _Canvas, px: np.ndarray, py: np.ndarray) -> None:
        self.canvas, self.px, self.py = canvas, px, py
        rr = px * px + py * py
        self.inside = rr <= 1.0
        nz = np.sqrt(np.clip(1.0 - rr, 0.0, 1.0))
        normal = np.stack([px, py, nz], -1) / np.sqrt(rr + nz * nz + 1e-12)[..., None]
        lambert = np.clip(normal @ (LIGHT / np.linalg.norm(LIGHT)), 0.0, 1.0)
        # Ambient floor keeps the far side readable (and distinct from the backdrop).
        self.shade = 0.35 + 0.65 * lambert

    def paint(self, colour: np.ndarray) -> None:
        shaded = np.broadcast_to(colour, self.canvas.rgb.shape) * self.shade[..., None]
        self.canvas.rgb[self.inside] = shaded[self.inside]
        self.canvas.alpha[self.inside] = 1.0


def _draw(size: int, seed: int) -> np.ndarray:
    """[size, size, 4] straight-alpha float RGBA in [0, 1]."""
    rng = np.random.default_rng(seed)
    hue = float(rng.uniform(0.0, 1.0))
    jitter = rng.uniform(-0.04, 0.04, size=8)
    canvas = _Canvas(size * SUPERSAMPLE)

    # Body: two-colour diagonal stripes.
    body = canvas.ellipse(jitter[0], 0.28 + jitter[1], 0.46, 0.52)
    stripes = (0.5 + 0.5 * np.tanh(4.0 * np.sin(9.0 * body.py + 2.0 * body.px)))[..., None]
    body.paint(_hsv(hue, 0.7, 0.85) * stripes + _hsv(hue + 0.5, 0.55, 0.75) * (1.0 - stripes))

    # Arms: checkered, a third hue.
    for side in (-1.0, 1.0):
        arm = canvas.ellipse(side * (0.5 + jitter[2]), 0.15 + jitter[3], 0.2, 0.13)
        check = ((np.floor(arm.px * 3.0) + np.floor(arm.py * 3.0)) % 2.0)[..., None]
        arm.paint(_hsv(hue + 0.33, 0.6, 0.8) * check + _hsv(hue + 0.33, 0.3, 0.55) * (1 - check))

    # Head: light tone with darker spots, and two eyes.
    hx, hy = float(jitter[4]), -0.42 + float(jitter[5])
    head = canvas.ellipse(hx, hy, 0.3, 0.3)
    spots = (np.sin(11.0 * head.px) * np.sin(11.0 * head.py) > 0.6)[..., None]
    head.paint(np.where(spots, _hsv(hue + 0.1, 0.5, 0.55), _hsv(hue + 0.08, 0.35, 0.85)))
    for side in (-1.0, 1.0):
        canvas.ellipse(hx + side * 0.11, hy - 0.03, 0.06, 0.075).paint(_hsv(0.6, 0.4, 0.15))

    # Hat: a flat brim and a crown, a fourth hue.
    canvas.ellipse(hx, hy - 0.25 + jitter[6], 0.32, 0.06).paint(_hsv(hue + 0.75, 0.6, 0.6))
    canvas.ellipse(hx, hy - 0.36 + jitter[7], 0.18, 0.14).paint(_hsv(hue + 0.75, 0.6, 0.7))

    # Box filter in premultiplied space, then back to straight alpha.
    f = SUPERSAMPLE
    premult = (canvas.rgb * canvas.alpha[..., None]).reshape(size, f, size, f, 3).mean((1, 3))
    alpha = canvas.alpha.reshape(size, f, size, f).mean(axis=(1, 3))
    rgb = np.where(alpha[..., None] > 0, premult / np.maximum(alpha, 1e-9)[..., None], 0.0)
    return np.concatenate([rgb, alpha[..., None]], axis=-1)


def main() -> None:
    """Write the bundled sample (256 px RGBA)."""
    BUNDLED_SAMPLE.parent.mkdir(parents=True, exist_ok=True)
    sample_image(256, seed=0).save(BUNDLED_SAMPLE, optimize=True)
    print(f"wrote {BUNDLED_SAMPLE} ({BUNDLED_SAMPLE.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
