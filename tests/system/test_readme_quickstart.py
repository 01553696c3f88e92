"""The README's quick start, run as written: `make up` in one process group, the client
commands, the Python client snippet and the webhook receiver in others, in a scratch directory
that links to this checkout (so `var/` and `out/` are the test's own). The one change made to
the README's text: its default ports (8080, 6390, 9000) become free ports, so the test never
meets a stack a developer is running."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from splatq.shared.redis.server import free_port
from splatq.shared.testing import eventually_sync
from tests.helpers import REPO_ROOT

README = REPO_ROOT / "README.md"
BLOCK = re.compile(r"<!-- quickstart:([a-z]+) -->\n```([a-z]+)\n(.*?)```", re.S)
STAMP = REPO_ROOT / ".venv" / ".installed"
DEFAULT_PORTS = ("8080", "6390", "9000")  # gateway, embedded Redis, the example receiver
# Linked into the scratch directory: what the README's commands name.
LINKED = ("Makefile", "pyproject.toml", ".venv", "services", "examples")
UP_TIMEOUT_S = 300.0  # the first start may load the model on a busy CPU


def quickstart_blocks() -> dict[str, tuple[str, str]]:
    """name -> (language, text) of each `<!-- quickstart:NAME -->` block of the README."""
    return {m[1]: (m[2], m[3]) for m in BLOCK.finditer(README.read_text(encoding="utf-8"))}


def test_readme_opens_with_the_marked_quick_start() -> None:
    """The README's first code block is the quick start (`make up`), and each block the
    newcomer runs is marked for the test below."""
    text = README.read_text(encoding="utf-8")
    blocks = quickstart_blocks()
    assert set(blocks) == {"stack", "client", "webhooks", "python"}
    assert blocks["stack"] == ("sh", "make up\n")
    first_block = re.search(r"```[a-z]*\n(.*?)```", text, re.S)
    assert first_block is not None
    assert first_block[1] == "make up\n"
    # The client comes before the engine's internals.
    assert text.index("<!-- quickstart:python -->") < text.index("splatq.shared.engine")


class Scratch:
    """A directory linked to the checkout, the environment of the README's commands there,
    and the process groups started in it (each killed by its own id at the end)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        for name in LINKED:
            (root / name).symlink_to(REPO_ROOT / name)
        self.ports = dict(
            zip(DEFAULT_PORTS, (str(free_port()) for _ in DEFAULT_PORTS), strict=True)
        )
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("SPLATQ_", "MAKE"))}
        self.env.update(
            SPLATQ_GATEWAY_PORT=self.ports["8080"],
            SPLATQ_EMBEDDED_REDIS_PORT=self.ports["6390"],
            SPLATQ_LOG_FORMAT="json",
            PYTHONUNBUFFERED="1",
        )
        self.groups: list[subprocess.Popen[bytes]] = []

    def localise(self, text: str) -> str:
        for default, port in self.ports.items():
            text = re.sub(rf"\b{default}\b", port, text)
        return text

    def start(self, argv: list[str], name: str) -> subprocess.Popen[bytes]:
        """Start `argv` in its own process group; its output goes to `<name>.out`."""
        with open(self.root / f"{name}.out", "wb") as out:
            proc = subprocess.Popen(
                argv,
                cwd=self.root,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.groups.append(proc)
        return proc

    def run(self, argv: list[str], name: str, timeout_s: float = 300) -> str:
        proc = self.start(argv, name)
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code = None
        output = self.output(name)
        assert code == 0, f"{name} exited {code}:\n{output}"
        return output

    def output(self, name: str) -> str:
        return (self.root / f"{name}.out").read_text(errors="replace")

    def wait_for(
        self, name: str, text: str, timeout_s: float, proc: subprocess.Popen[bytes] | None = None
    ) -> None:
        """Poll `name`'s output for `text`; fails when `proc` (if given) exits first."""

        def seen() -> bool:
            if proc is not None and proc.poll() is not None:
                pytest.fail(f"{name} exited {proc.returncode}:\n{self.output(name)}")
            return text in self.output(name)

        eventually_sync(
            seen, timeout_s, 0.2, message=lambda: f"{text!r} from {name}:\n{self.output(name)}"
        )

    def stop_all(self) -> None:
        """SIGINT each group (Ctrl-C, as a user stops `make up`), then SIGKILL what is left."""
        for proc in reversed(self.groups):
            with_signal(proc, signal.SIGINT)
        deadline = time.monotonic() + 30
        for proc in reversed(self.groups):
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            with_signal(proc, signal.SIGKILL)  # the group: children and orphans too


def with_signal(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)  # the group this test started (start_new_session)


@pytest.fixture
def scratch(tmp_path: Path) -> Iterator[Scratch]:
    if not STAMP.exists() or STAMP.stat().st_mtime < (REPO_ROOT / "pyproject.toml").stat().st_mtime:
        pytest.skip("`make install` first: `make up` here must not reinstall from a scratch dir")
    s = Scratch(tmp_path)
    yield s
    s.stop_all()


def test_readme_quick_start_works_as_written(scratch: Scratch) -> None:
    blocks = {name: scratch.localise(text) for name, (_, text) in quickstart_blocks().items()}
    stack = scratch.start(["bash", "-c", blocks["stack"]], "stack")
    scratch.wait_for("stack", "splatq is up", UP_TIMEOUT_S, stack)
    key = (scratch.root / "var" / "dev-api-key").read_text().strip()
    assert key.startswith("sq_dev_")
    assert key in scratch.output("stack")

    # The second terminal: the client commands, then the webhook ones (same shell: the key
    # exported by the first block). The receiver stays in the background, in this group.
    terminal = blocks["client"] + blocks["webhooks"]
    out = scratch.run(["bash", "-euo", "pipefail", "-c", terminal], "terminal")
    for artifact in ("scene.ply", "scene.splat", "preview.png"):
        assert (scratch.root / "out" / artifact).stat().st_size > 0, out
    assert '"id":"job_' in out  # curl's 202 answer
    scratch.wait_for("terminal", '"event":"3d_reconstruction.completed"', 120)

    python = scratch.run([str(scratch.root / ".venv/bin/python"), "-c", blocks["python"]], "python")
    assert "3d_reconstruction.completed" in python.splitlines(), python
    assert "out/scene.ply" in python.splitlines(), python
