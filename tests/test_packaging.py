"""The install layout: every package folder is listed under the `splatq` namespace, the
package data the services read at run time ships, and nothing imports the old top-level names."""

from __future__ import annotations

import ast
import email
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _pyproject() -> dict:  # type: ignore[type-arg]
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_every_package_folder_is_installed_under_the_splatq_namespace() -> None:
    listed = set(_pyproject()["tool"]["setuptools"]["packages"])
    on_disk = set()
    for top in ("shared", "services"):
        for folder, dirs, files in os.walk(ROOT / top):
            dirs[:] = [d for d in dirs if not d.startswith((".", "__"))]
            if "__init__.py" in files:
                rel = Path(folder).relative_to(ROOT)
                on_disk.add("splatq." + ".".join(rel.parts))
    assert listed == on_disk


def test_package_data_names_the_lua_scripts_and_the_bundled_sample() -> None:
    data = _pyproject()["tool"]["setuptools"]["package-data"]
    lua_dirs = sorted(path.parent for path in (ROOT / "shared").rglob("lua/*.lua"))
    for lua_dir in lua_dirs:  # every package that owns scripts ships them
        package = "splatq." + ".".join(lua_dir.parent.relative_to(ROOT).parts)
        assert "lua/*.lua" in data[package], package
    assert ROOT / "shared" / "engine" / "lua" in lua_dirs
    assert "samples/*.png" in data["splatq.services.gpu_worker"]
    assert (ROOT / "services" / "gpu_worker" / "samples" / "sample.png").is_file()


def test_no_module_imports_the_old_top_level_names() -> None:
    offenders = []
    for path in [
        *ROOT.glob("shared/**/*.py"),
        *ROOT.glob("services/**/*.py"),
        *ROOT.glob("tests/**/*.py"),
        *ROOT.glob("bench/**/*.py"),
        *ROOT.glob("examples/**/*.py"),
    ]:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            offenders += [
                f"{path.relative_to(ROOT)}: {n}"
                for n in names
                if n.split(".")[0] in {"shared", "services"}
            ]
    assert offenders == []


def test_the_common_library_never_imports_a_service() -> None:
    offenders = []
    for path in ROOT.glob("shared/**/*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "splatq.services"
            ):
                offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []


# -- the built wheel, installed where nothing else is --------------------------------------

SOURCES = ("pyproject.toml", "README.md", "LICENSE", "CHANGELOG.md", "shared", "services")


def _run(*cmd: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPLATQ_", "PYTHON"))}
    proc = subprocess.run(
        [str(c) for c in cmd],
        check=False,
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, f"{cmd}: {proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`pip wheel` of a copy of the sources (setuptools writes build/ next to them)."""
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / name, src / name)
    dist = tmp_path_factory.mktemp("dist")
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", dist, src)  # fmt: skip
    (built,) = dist.glob("splatq-*.whl")
    return built


def test_the_wheel_ships_types_license_data_and_light_metadata(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        (meta_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        meta = email.message_from_bytes(zf.read(meta_name))
    packages = _pyproject()["tool"]["setuptools"]["packages"]
    missing_typed = [p for p in packages if f"{p.replace('.', '/')}/py.typed" not in names]
    assert missing_typed == []
    assert "splatq/services/gpu_worker/samples/sample.png" in names
    console = ROOT / "services" / "gateway" / "console_assets"
    assets = [p.relative_to(console).as_posix() for p in console.rglob("*") if p.is_file()]
    assert {"index.html", "js/app.js", "viewer/splat-viewer.js"} <= set(assets)
    shipped = {n.removeprefix("splatq/services/gateway/console_assets/") for n in names}
    assert set(assets) <= shipped  # the web console needs no build step: its files are here
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    shipped_lua = sorted(n for n in names if n.endswith(".lua"))
    on_disk_lua = sorted(
        "splatq/" + p.relative_to(ROOT).as_posix() for p in (ROOT / "shared").rglob("lua/*.lua")
    )
    assert shipped_lua == on_disk_lua
    assert meta["License-Expression"] == "Apache-2.0"
    requires = meta.get_all("Requires-Dist") or []
    torch = [r for r in requires if r.startswith("torch")]
    assert torch
    assert all('extra == "worker"' in r for r in torch), torch
    aiohttp = [r.replace(" ", "") for r in requires if r.startswith("aiohttp")]
    assert aiohttp in (["aiohttp<4,>=3.12"], ["aiohttp>=3.12,<4"]), aiohttp
    assert "worker" in (meta.get_all("Provides-Extra") or [])
    classifiers = meta.get_all("Classifier") or []
    assert "Typing :: Typed" in classifiers
    assert any(c.startswith("Programming Language :: Python :: 3.11") for c in classifiers)
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL") or [])
    assert {"Homepage", "Changelog", "Issues"} <= set(urls)


def _installed_versions() -> str:
    """Constraints pinning every distribution of this environment, so the fresh venv resolves
    the same versions (from pip's cache: no build, little download)."""
    lines = []
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name and name.lower() != "splatq":
            lines.append(f"{name}=={dist.version}")
    return "\n".join(sorted(set(lines))) + "\n"


LIGHT_CHECK = """
import importlib, importlib.resources, json, sys
from PIL import Image
mods = ["splatq.services.cli.main", "splatq.shared.client", "splatq.services.gateway.app",
        "splatq.services.webhook_dispatcher.__main__", "splatq.services.dlq_redriver.commands"]
files = {m: importlib.import_module(m).__file__ for m in mods}
sample = importlib.resources.files("splatq.services.gpu_worker") / "samples" / "sample.png"
with sample.open("rb") as fh:
    img = Image.open(fh)
    img.load()
import splatq.shared
from splatq.services.gateway.console import load_assets
assert "js/app.js" in load_assets()
print(json.dumps({"files": files, "size": img.size, "torch": "torch" in sys.modules,
                  "version": splatq.shared.__version__, "prefix": sys.prefix}))
"""


def test_the_wheel_installs_in_a_fresh_venv_without_torch(wheel: Path, tmp_path: Path) -> None:
    """`pip install splatq` (no extra) in an empty venv: `splatq --version` and `--help` run,
    the gateway, dispatcher, redriver, CLI and client import without torch, and the sample
    image `splatq demo` submits is installed and decodes."""
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv)  # no system site-packages
    python = venv / "bin" / "python"
    constraints = tmp_path / "constraints.txt"
    constraints.write_text(_installed_versions(), encoding="utf-8")
    _run(sys.executable, "-m", "pip", "--python", python, "install", "-q",
         "-c", constraints, wheel)  # fmt: skip
    version = _pyproject()["project"]["version"]
    assert _run(venv / "bin" / "splatq", "--version").stdout.strip() == f"splatq {version}"
    help_text = _run(venv / "bin" / "splatq", "--help").stdout
    assert "submit" in help_text
    assert "exit codes" in help_text
    probe = subprocess.run(
        [python, "-c", "import torch"], check=False, cwd=tmp_path, capture_output=True, timeout=60
    )
    assert probe.returncode != 0, "torch got installed without the worker extra"
    probe = subprocess.run(
        [python, "-c", "import cv2"], check=False, cwd=tmp_path, capture_output=True, timeout=60
    )
    assert probe.returncode != 0, "OpenCV got installed without the worker extra"
    report = json.loads(_run(python, "-c", LIGHT_CHECK, cwd=tmp_path).stdout)
    assert report["torch"] is False
    assert report["version"] == version
    for module, path in report["files"].items():
        assert Path(path).is_relative_to(venv), f"{module} came from {path}, not the wheel"
    assert min(report["size"]) > 0


def test_one_version_for_the_package_the_cli_and_the_openapi_document() -> None:
    from splatq.services.gateway.openapi import openapi_document  # noqa: PLC0415
    from splatq.shared import __version__  # noqa: PLC0415

    assert __version__ == importlib.metadata.version("splatq")
    assert __version__ == _pyproject()["project"]["version"]
    assert openapi_document("http://x")["info"]["version"] == __version__
    proc = subprocess.run(
        [sys.executable, "-m", "splatq.services.cli", "--version"],
        check=False, capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert proc.stdout.strip() == f"splatq {__version__}"
