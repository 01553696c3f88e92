""".spz against .ply (and .splat): bytes on the wire, and what the console's viewer shows.

For the bundled sample reconstructed by the builtin model at each quality's resolution (and a
synthetic cloud of `--synthetic` Gaussians for scale), each artifact's size and encode time;
then the real viewer (the console's WebGL2 renderer, in Debian's headless Chromium on
SwiftShader) draws the front view (the input camera) and a turned view of the .ply, the .spz
and the .splat at 512x512, and the PSNR of the .spz's and the .splat's pictures against the
.ply's is reported (the .ply holds the exact float32 values: it is the reference).

Usage: python -m bench.spz_quality [--synthetic 262144] [--size 512]
Run it under `flock /tmp/splatq-bench.lock` on a shared machine.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import math
import platform
import shutil
import time
from io import BytesIO
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from splatq.services.gpu_worker import formats, spz
from splatq.services.gpu_worker.builtin_model import SilhouetteInflationModel
from splatq.services.gpu_worker.gaussians import Gaussians
from splatq.services.gpu_worker.images import decode_image

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "services" / "gpu_worker" / "samples" / "sample.png"
VIEWER = ROOT / "services" / "gateway" / "console_assets" / "viewer"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--use-angle=swiftshader", "--enable-unsafe-swiftshader", "--ignore-gpu-blocklist"]
VIEWS = {"front": (0.0, 0.0), "turned": (0.6, 0.2)}  # (yaw, pitch) in radians

DRAW = """async ([name, b64, yaw, pitch]) => {
  const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  const cloud = await SplatqFormats.parse(name, bytes.buffer);
  const old = document.getElementById("c");
  const canvas = old.cloneNode();
  old.replaceWith(canvas);
  const viewer = SplatqViewer.create(canvas, { preserveDrawingBuffer: true });
  viewer.setCloud(cloud);
  viewer.orbit(yaw, pitch);
  viewer.render();
  const url = canvas.toDataURL("image/png");
  viewer.destroy();
  return url.slice(url.indexOf(",") + 1);
}"""


def sample_gaussians(resolution: int) -> Gaussians:
    model = SilhouetteInflationModel()
    model.load(torch.device("cpu"))
    image = decode_image(SAMPLE.read_bytes(), resolution)
    [g] = model.infer(image.unsqueeze(0))
    return g


def synthetic(n: int, seed: int = 7) -> Gaussians:
    """A ball of `n` small Gaussians two units in front of the camera."""
    gen = torch.Generator().manual_seed(seed)
    direction = torch.nn.functional.normalize(torch.randn(n, 3, generator=gen), dim=1)
    radius = torch.rand(n, 1, generator=gen) ** (1 / 3) * 0.6
    means = direction * radius + torch.tensor([0.0, 0.0, 2.0])
    return Gaussians(
        means,
        torch.rand(n, 3, generator=gen) * 1.5 - 6.0,
        torch.randn(n, 4, generator=gen),
        torch.randn(n, generator=gen) * 2.0,
        torch.randn(n, 3, generator=gen),
    )


def encode(g: Gaussians) -> dict[str, tuple[bytes, float]]:
    out = {}
    for name, fn in (("ply", formats.to_ply_bytes), ("splat", formats.to_splat_bytes),
                     ("spz", spz.to_spz_bytes)):  # fmt: skip
        started = time.perf_counter()
        data = fn(g)
        out[name] = (data, (time.perf_counter() - started) * 1000)
    return out


def psnr(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


async def render_all(
    scenes: dict[str, dict[str, tuple[bytes, float]]], size: int
) -> dict[tuple[str, str, str], np.ndarray[Any, Any]]:
    from playwright.async_api import async_playwright  # noqa: PLC0415

    pictures = {}
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        page = await browser.new_page(viewport={"width": size, "height": size})
        await page.set_content(
            f'<body style="margin:0"><canvas id="c" style="display:block;width:{size}px;'
            f'height:{size}px"></canvas></body>'
        )
        for script in ("splat-formats.js", "splat-viewer.js"):
            await page.add_script_tag(path=str(VIEWER / script))
        for scene, files in scenes.items():
            for fmt, (data, _) in files.items():
                b64 = base64.b64encode(data).decode()
                for view, (yaw, pitch) in VIEWS.items():
                    png = await page.evaluate(DRAW, [f"scene.{fmt}", b64, yaw, pitch])
                    image = Image.open(BytesIO(base64.b64decode(png))).convert("RGB")
                    pictures[scene, fmt, view] = np.asarray(image)
        await browser.close()
    return pictures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--synthetic", type=int, default=262_144)
    parser.add_argument("--size", type=int, default=512)
    args = parser.parse_args()
    clouds = {
        "sample, preview (128 px)": sample_gaussians(128),
        "sample, full (512 px)": sample_gaussians(512),
        f"synthetic ball ({args.synthetic:,})": synthetic(args.synthetic),
    }
    scenes = {name: encode(g) for name, g in clouds.items()}
    pictures = asyncio.run(render_all(scenes, args.size))
    print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"viewer {args.size}x{args.size} in headless Chromium (SwiftShader)\n")  # fmt: skip
    print(
        "| scene | Gaussians | .ply | .splat | .spz | .ply/.spz | .spz encode | "
        "PSNR .spz front | PSNR .spz turned | PSNR .splat front | PSNR .splat turned |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, g in clouds.items():
        files = scenes[name]
        sizes = {k: len(v[0]) for k, v in files.items()}
        cells = [
            name, f"{g.count:,}", f"{sizes['ply'] / 1024:,.0f} KiB",
            f"{sizes['splat'] / 1024:,.0f} KiB", f"{sizes['spz'] / 1024:,.0f} KiB",
            f"{sizes['ply'] / sizes['spz']:.1f}x", f"{files['spz'][1]:.0f} ms",
        ]  # fmt: skip
        for fmt in ("spz", "splat"):
            for view in VIEWS:
                ref = pictures[name, "ply", view]
                cells.append(f"{psnr(pictures[name, fmt, view], ref):.1f} dB")
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
