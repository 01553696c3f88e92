"""The container image, as far as it can be tested without pulling a base image: the build
context `.dockerignore` lets through, the Dockerfile's install step (docker/install.sh) run
on a clean copy of that context, which must give a working `splatq --version` and a gateway
whose `splatq gateway --check` passes, the Dockerfile's promises (non-root UID of the
manifests, OCI labels, the torch pin), and hadolint.

The install runs in a fresh virtual environment that sees this checkout's installed
dependencies through a .pth file (so pip downloads nothing but the build backend), while splatq
itself is built and installed from the copied context: what the image would hold.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import pytest

from splatq.shared.redis.server import RedisServer, free_port
from splatq.shared.testing import eventually_sync
from tests.deploy.manifests import PACKAGE_VERSION, REPO_ROOT, build, pod_templates

DOCKERFILE = REPO_ROOT / "Dockerfile"
INSTALL = REPO_ROOT / "docker" / "install.sh"
HADOLINT = shutil.which("hadolint") or shutil.which(
    "hadolint", path=str(Path(sys.executable).parent)
)


# -- .dockerignore, as Docker reads it (moby/patternmatcher) -------------------------------------


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def dockerignore_rules(text: str) -> list[tuple[bool, re.Pattern[str]]]:
    """(is an exception `!`, regex) per pattern, in order."""
    rules = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        pattern = os.path.normpath(line.lstrip("!").strip()).lstrip("/")
        rules.append((negated, _pattern_regex(pattern)))
    return rules


def ignored(rules: list[tuple[bool, re.Pattern[str]]], rel: str) -> bool:
    """The last pattern that matches the path, or one of its parent folders, decides."""
    parts = rel.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(len(parts), 0, -1)]
    result = False
    for negated, regex in rules:
        if any(regex.fullmatch(p) for p in prefixes):
            result = not negated
    return result


def context_files(root: Path, rules: list[tuple[bool, re.Pattern[str]]]) -> Iterator[str]:
    """Files under root that the context keeps (folders pruned when excluded and no exception
    can bring back anything below them)."""
    exceptions = [regex for negated, regex in rules if negated]
    for folder, dirs, files in os.walk(root):
        rel_folder = os.path.relpath(folder, root)
        rel_folder = "" if rel_folder == "." else rel_folder + "/"
        keep_dirs = []
        for d in dirs:
            rel = rel_folder + d
            reopened = any(r.pattern.startswith(re.escape(rel)) for r in exceptions)
            if not ignored(rules, rel) or reopened:
                keep_dirs.append(d)
        dirs[:] = keep_dirs
        for f in files:
            if not ignored(rules, rel_folder + f):
                yield rel_folder + f


def build_context() -> set[str]:
    rules = dockerignore_rules((REPO_ROOT / ".dockerignore").read_text(encoding="utf-8"))
    return set(context_files(REPO_ROOT, rules))


def test_dockerignore_matching_follows_docker() -> None:
    rules = dockerignore_rules("*\n!shared/\n**/__pycache__\n!README.md\n")
    assert ignored(rules, "tests/test_x.py")
    assert ignored(rules, ".venv/bin/python")
    assert not ignored(rules, "shared/settings.py")
    assert ignored(rules, "shared/__pycache__/settings.cpython-311.pyc")
    assert not ignored(rules, "README.md")
    assert ignored(rules, "docs/README.md")


def test_the_context_holds_what_the_image_installs_and_nothing_else() -> None:
    files = build_context()
    tops = {f.split("/")[0] for f in files}
    assert tops == {"pyproject.toml", "README.md", "LICENSE", "shared", "services", "docker"}
    assert not [f for f in files if "__pycache__" in f or f.endswith(".pyc")]
    assert "shared/settings/__init__.py" in files
    assert "docker/install.sh" in files
    # every COPY of the Dockerfile (not --from another stage) names something in the context
    for line in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        if line.startswith("COPY ") and "--from=" not in line:
            for source in line.split()[1:-1]:
                assert any(f == source or f.startswith(source + "/") for f in files), source


# -- the Dockerfile --------------------------------------------------------------------------


def dockerfile_text() -> str:
    return DOCKERFILE.read_text(encoding="utf-8")


def arg_default(name: str) -> str:
    found = re.search(rf"^ARG {name}=(\S+)$", dockerfile_text(), re.M)
    assert found, name
    return found.group(1)


def final_stage() -> str:
    return dockerfile_text().rsplit("\nFROM ", 1)[1]


def test_the_image_runs_as_the_manifests_non_root_user() -> None:
    user = re.search(r"^USER (\d+):(\d+)$", final_stage(), re.M)
    assert user, "the final stage must set a numeric USER uid:gid"
    uid, gid = int(user.group(1)), int(user.group(2))
    assert uid != 0
    assert gid != 0
    for pod in pod_templates(build("base")):
        sc = pod.spec["securityContext"]
        assert (sc["runAsUser"], sc["runAsGroup"]) == (uid, gid), pod.owner
    assert re.search(r"^ENV .*HOME=/tmp", final_stage(), re.M | re.S)


def test_the_image_is_multi_stage_with_oci_labels() -> None:
    assert len(re.findall(r"^FROM ", dockerfile_text(), re.M)) >= 3
    assert "COPY --from=build /opt/splatq /opt/splatq" in final_stage()
    labels = dict(re.findall(r'(org\.opencontainers\.image\.[a-z]+)="([^"]*)"', final_stage()))
    pyproject = (REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8")
    [license_] = re.findall(r'^license = "([^"]+)"', pyproject, re.M)
    [homepage] = re.findall(r'^Homepage = "([^"]+)"', pyproject, re.M)
    assert labels["org.opencontainers.image.licenses"] == license_
    assert labels["org.opencontainers.image.source"] == homepage
    assert labels["org.opencontainers.image.version"] == "${SPLATQ_VERSION}"
    assert arg_default("SPLATQ_VERSION") == PACKAGE_VERSION
    assert re.search(r'^ENTRYPOINT \["splatq"\]$', final_stage(), re.M)


def test_the_torch_pin_and_the_cuda_variant() -> None:
    pyproject = (REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8")
    [pin] = re.findall(r'"torch==([^"]+)"', pyproject)
    assert arg_default("TORCH_VERSION") == pin
    assert arg_default("TORCH_INDEX_URL").endswith("/cpu")
    makefile = (REPO_ROOT / "Makefile").read_text(encoding="utf-8")
    assert "command -v docker" in makefile
    assert "command -v podman" in makefile
    cuda = re.search(r"^image-cuda:.*?(?=^\S)", makefile, re.M | re.S)
    assert cuda
    assert "BASE_IMAGE=" in cuda.group(0)
    assert "TORCH_INDEX_URL=" in cuda.group(0)
    assert re.search(r"^CUDA_BASE_IMAGE \?= nvidia/cuda:\S+-runtime-", makefile, re.M)


@pytest.mark.skipif(HADOLINT is None, reason="hadolint is not installed (make deploy-tools)")
def test_hadolint_passes(tmp_path: Path) -> None:
    assert HADOLINT
    result = subprocess.run(
        [HADOLINT, "--failure-threshold", "info", str(DOCKERFILE)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get install curl\nUSER root\n", encoding="utf-8")
    result = subprocess.run([HADOLINT, str(bad)], capture_output=True, timeout=60, check=False)
    assert result.returncode != 0  # the linter does fail


# -- the install step on a clean copy of the context ----------------------------------------------


def run(
    argv: list[str], env: dict[str, str], timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtual environment made by the image's install step from a clean context copy."""
    root = tmp_path_factory.mktemp("image")
    context, venv = root / "context", root / "venv"
    for rel in build_context():
        (context / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO_ROOT / rel, context / rel)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPLATQ_", "VIRTUAL_ENV"))}
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"  # python3: this Python
    env.pop("TORCH_INDEX_URL", None)
    first = run(["sh", str(context / "docker/install.sh"), str(venv)], env)
    assert first.returncode == 0, first.stderr
    # this checkout's dependencies (torch included), never its editable splatq: a .pth line
    # only adds a path, the editable finder's own .pth there is not run
    purelib = venv / Path(sysconfig.get_path("purelib")).relative_to(sysconfig.get_path("data"))
    (purelib / "checkout-deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    second = run(["sh", str(context / "docker/install.sh"), str(venv), str(context)], env)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    return venv


def test_the_install_step_yields_a_working_cli(installed: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPLATQ_")}
    version = run([str(installed / "bin/splatq"), "--version"], env)
    assert version.stdout.strip() == f"splatq {PACKAGE_VERSION}"
    python = str(installed / "bin/python")
    script = (
        "import pathlib, splatq.services.cli as cli, splatq.shared.engine as engine\n"
        "print(cli.__file__)\n"
        "print(len(list(pathlib.Path(engine.__file__).parent.glob('lua/*.lua'))))"
    )
    where, lua = run([python, "-c", script], env).stdout.split()
    assert where.startswith(str(installed)), where  # the built copy, not this tree
    assert int(lua) > 0, "the package data (Lua scripts) is missing from the image"


def test_the_installed_gateway_passes_its_check(
    installed: Path, redis_server: RedisServer, tmp_path: Path
) -> None:
    splatq = str(installed / "bin/splatq")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPLATQ_")}
    env |= {
        "SPLATQ_REDIS_URL": redis_server.url,
        "SPLATQ_GATEWAY_HOST": "127.0.0.1",
        "SPLATQ_GATEWAY_PORT": str(free_port()),
        "SPLATQ_API_KEYS": "t:image-test-key",
        "SPLATQ_STORAGE_URL": f"file://{tmp_path}",
        "SPLATQ_LOG_FORMAT": "json",
    }
    assert run([splatq, "gateway", "--check"], env, 30).returncode == 1  # nothing there yet
    for service in ("settler",):
        assert run([splatq, service, "--check"], env, 30).returncode == 0, service
    gateway = subprocess.Popen(
        [splatq, "gateway"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:

        def healthy() -> subprocess.CompletedProcess[str]:
            if gateway.poll() is not None:
                pytest.fail(gateway.stderr.read().decode() if gateway.stderr else "")
            check = run([splatq, "gateway", "--check"], env, 30)
            assert check.returncode == 0, check.stdout
            return check

        check = eventually_sync(healthy, timeout=60, interval=0.2, retry_on=AssertionError)
        assert "gateway: healthy" in check.stdout
    finally:
        gateway.terminate()
        gateway.wait(timeout=30)
