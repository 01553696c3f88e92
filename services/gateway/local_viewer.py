"""The stand-alone viewer written next to downloaded artifacts (`make demo`'s viewer.html):
the console's own viewer files, and the scene embedded as base64 in `viewer/scene-data.js`,
so the page shows it when opened straight from disk (browsers refuse a page from disk to read
the files beside it)."""

from __future__ import annotations

import base64
from pathlib import Path

import orjson

from splatq.services.gateway.console import load_assets

VIEWER_FILES = ("splat-formats.js", "splat-viewer.js", "standalone.js", "standalone.css")


def write_local_viewer(out_dir: Path, scene_name: str, scene: bytes) -> Path:
    """Write `<out_dir>/viewer.html` and `<out_dir>/viewer/` showing `scene` (its file name
    tells its format: .spz, .splat or .ply). Returns the page's path."""
    assets = load_assets()
    folder = out_dir / "viewer"
    folder.mkdir(parents=True, exist_ok=True)
    for name in VIEWER_FILES:
        (folder / name).write_bytes(assets[f"viewer/{name}"][0])
    embedded = {"name": scene_name, "base64": base64.b64encode(scene).decode("ascii")}
    (folder / "scene-data.js").write_bytes(
        b"window.SPLATQ_SCENE = " + orjson.dumps(embedded) + b";\n"
    )
    page = assets["viewer/standalone.html"][0].decode()
    for name in (*VIEWER_FILES, "scene-data.js"):
        page = page.replace(f'"{name}"', f'"viewer/{name}"')
    path = out_dir / "viewer.html"
    path.write_text(page, encoding="utf-8")
    return path
