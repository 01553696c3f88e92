"""`pip install splatq` without the `worker` extra has no torch and no OpenCV (and without
the `learned` extra no onnxruntime): the gateway, the webhook dispatcher, the redriver, the
CLI and the client library must import and `splatq --help` must run with them made
unimportable (a meta-path hook in a fresh interpreter). The gateway checks HEIC/AVIF and
EXIF orientation with Pillow and pillow-heif alone. The wheel itself is installed without
torch in tests/test_packaging.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib

from tests.helpers import REPO_ROOT

BLOCK_TORCH = """
import importlib.abc, sys

class NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"torch", "cv2", "onnxruntime"}:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
        return None

sys.meta_path.insert(0, NoTorch())
"""

LIGHT_MODULES = [
    "splatq.shared.client",
    "splatq.services.cli.main",
    "splatq.services.cli.client",
    "splatq.services.cli.info",
    "splatq.services.cli.health",
    "splatq.services.stack",
    "splatq.services.gateway.app",
    "splatq.services.gateway.__main__",
    "splatq.services.webhook_dispatcher.__main__",
    "splatq.services.dlq_redriver.commands",
    "splatq.services.quota_settler.__main__",
    "splatq.services.cli.tenant",
    "splatq.shared.engine.runner",
]


def _python(code: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPLATQ_")}
    return subprocess.run(
        [sys.executable, "-c", BLOCK_TORCH + code],
        check=False,
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_light_modules_import_and_help_runs_without_torch() -> None:
    code = f"""
import contextlib, importlib, io, json
failed = {{}}
for name in {LIGHT_MODULES!r}:
    try:
        importlib.import_module(name)
    except Exception as exc:
        failed[name] = repr(exc)
from splatq.services.cli.main import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        main(["--help"])
    except SystemExit as exit:
        code = exit.code
heavy = sorted(m for m in ("torch", "cv2", "onnxruntime") if m in sys.modules)
print(json.dumps({{"failed": failed, "heavy": heavy, "help": out.getvalue(), "code": code}}))
"""
    proc = _python(code)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["failed"] == {}
    assert report["heavy"] == []
    assert report["code"] == 0
    assert "submit" in report["help"]
    assert "worker" in report["help"]


def test_the_hook_really_blocks_torch_for_the_gpu_worker() -> None:
    """The control: the reconstruction handler does need torch, so under the hook it fails
    (otherwise the test above would prove nothing)."""
    proc = _python("import splatq.services.gpu_worker.handler")
    assert proc.returncode != 0
    assert "No module named 'torch' (blocked)" in proc.stderr


def test_worker_without_torch_says_which_extra_to_install() -> None:
    code = """
from splatq.services.cli.main import main
raise SystemExit(main(["worker"]))
"""
    proc = _python(code)
    assert proc.returncode == 78
    assert "pip install 'splatq[worker]'" in proc.stderr


def test_torch_is_only_in_the_worker_extra_and_dev_pulls_it() -> None:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert not [d for d in project["dependencies"] if d.startswith("torch")]
    assert any(d.startswith("torch==") for d in project["optional-dependencies"]["worker"])
    assert "splatq[worker]" in project["optional-dependencies"]["dev"]
    aiohttp = [d for d in project["dependencies"] if d.startswith("aiohttp")]
    assert aiohttp == ["aiohttp>=3.12,<4"]
