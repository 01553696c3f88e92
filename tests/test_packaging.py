"""The install layout: every package folder is listed under the `splatq` namespace, the
package data the services read at run time ships, and nothing imports the old top-level names."""

from __future__ import annotations

import ast
import os
import tomllib
from pathlib import Path

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
    assert "lua/*.lua" in data["splatq.shared.engine"]
    assert list((ROOT / "shared" / "engine" / "lua").glob("*.lua"))
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
