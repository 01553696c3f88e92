"""What tests/deploy reads: the built overlays, the pods in them, the CLI invocations their
containers run, the environment those containers get, and the restricted Pod Security check.

Pure functions over parsed YAML; the only I/O is building a folder of k8s/: with kubectl's
built-in kustomize or a `kustomize` binary where one is installed, else with kustomize_lite
(held to the real one by test_kustomize_lite.py wherever both exist).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import io
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from splatq.services.cli import main as cli
from splatq.shared.engine.stages import parse_stage_list
from splatq.shared.settings import declared_variables
from tests.deploy import kustomize_lite

REPO_ROOT = Path(__file__).resolve().parents[2]
K8S = REPO_ROOT / "k8s"
# The kustomizations a user applies as a whole: `kubectl apply -k k8s/<folder>`.
OVERLAYS = ("base", "overlays/dev", "overlays/gpu")
PACKAGE_VERSION = re.search(
    r'^version = "([^"]+)"', (REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"), re.M
).group(1)  # type: ignore[union-attr]
# The project's image, as each overlay names it: the base's placeholder registry (gpu overlay:
# also its CUDA variant), the locally built `splatq` (dev overlay, compose.yaml).
PROJECT_IMAGE_NAMES = frozenset({"registry.example.com/splatq", "splatq"})
PROJECT_IMAGE_TAGS = frozenset({PACKAGE_VERSION, f"{PACKAGE_VERSION}-cuda"})
# Third-party images, allowed only where a stack brings its own Redis and object storage.
DEV_DEPENDENCY_IMAGES = frozenset(
    {
        "redis:7.4.2-alpine",
        "quay.io/minio/minio:RELEASE.2025-04-22T22-12-26Z",
        "quay.io/minio/mc:RELEASE.2025-04-16T18-13-26Z",
    }
)
# Variables a splatq container may get besides the settings: the image's runtime (HOME and
# caches on the writable /tmp, Python's flags) and the AWS SDK's credentials and region.
RUNTIME_VARIABLES = frozenset(
    {"HOME", "XDG_CACHE_HOME", "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED"}
)
AWS_SDK_VARIABLES = frozenset(
    {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION", "AWS_DEFAULT_REGION"}
)
# KEDA's redis-streams scalers read the bare password from the Secret (examples/redis-cluster)
KEDA_VARIABLES = frozenset({"KEDA_REDIS_PASSWORD"})
POD_OWNERS = ("Deployment", "StatefulSet", "DaemonSet", "Job")


# -- building --------------------------------------------------------------------------------


def kustomize_command() -> list[str] | None:
    """`kustomize build` or `kubectl kustomize`, whichever is installed (None: neither)."""
    if binary := shutil.which("kustomize"):
        return [binary, "build"]
    if kubectl := shutil.which("kubectl"):
        return [kubectl, "kustomize"]
    return None


@cache
def build(folder: str) -> tuple[dict[str, Any], ...]:
    """The objects `kubectl apply -k k8s/<folder>` would apply (offline)."""
    command = kustomize_command()
    if command is None:
        return tuple(kustomize_lite.build(K8S / folder))
    return build_with(command, folder)


def build_with(command: list[str], folder: str) -> tuple[dict[str, Any], ...]:
    result = subprocess.run(
        [*command, str(K8S / folder)], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, f"kustomize {folder}: {result.stderr[-2000:]}"
    return tuple(d for d in yaml.safe_load_all(result.stdout) if d)


def objects_of(docs: tuple[dict[str, Any], ...], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


# -- pods ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PodTemplate:
    """A pod some controller in an overlay runs: its owner, labels and spec."""

    owner: str  # "Kind/name"
    namespace: str
    labels: Mapping[str, str]
    spec: Mapping[str, Any]

    def containers(self) -> list[dict[str, Any]]:
        spec = self.spec
        return [*spec.get("initContainers", []), *spec["containers"]]

    def named_ports(self) -> dict[str, int]:
        return {
            p["name"]: int(p["containerPort"])
            for c in self.containers()
            for p in c.get("ports", [])
            if "name" in p
        }


def pod_templates(docs: tuple[dict[str, Any], ...]) -> list[PodTemplate]:
    pods = []
    for d in docs:
        if d["kind"] not in POD_OWNERS:
            continue
        template = d["spec"]["template"]
        pods.append(
            PodTemplate(
                owner=f"{d['kind']}/{d['metadata']['name']}",
                namespace=d["metadata"].get("namespace", "default"),
                labels=template["metadata"].get("labels", {}),
                spec=template["spec"],
            )
        )
    return pods


def image_name_and_tag(image: str) -> tuple[str, str]:
    name, _, tag = image.rpartition(":")
    if not name or "/" in tag:  # no tag (a registry port is not a tag)
        return image, ""
    return name, tag


def is_project_image(image: str) -> bool:
    return image_name_and_tag(image)[0] in PROJECT_IMAGE_NAMES


def splatq_containers(docs: tuple[dict[str, Any], ...]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(owner, container) of every container that runs the project's image."""
    for pod in pod_templates(docs):
        for c in pod.containers():
            if is_project_image(c["image"]):
                yield pod.owner, c


# -- the CLI a container runs ----------------------------------------------------------------

SHELL_OPERATORS = re.compile(r"\|\||&&|;|\|")


def splatq_invocations(argv: list[str]) -> list[list[str]]:
    """The `splatq` argument lists a container's command runs: `splatq ARGS`, or each `splatq`
    command of an `sh -c` script (redirections dropped). A command that is neither is an
    error: the image has no other entry point worth running."""
    if argv and argv[0] == "splatq":
        return [argv[1:]]
    if argv[:2] == ["sh", "-c"] and len(argv) == 3:
        found = []
        for part in SHELL_OPERATORS.split(argv[2]):
            words = [w for w in shlex.split(part) if not re.match(r"^\d?>|^<|^\d?>&", w)]
            if words:
                assert words[0] == "splatq", f"the script runs {words[0]!r}, not splatq"
                found.append(words[1:])
        return found
    raise AssertionError(f"not a splatq command: {argv}")


def cli_problem(args: list[str]) -> str | None:
    """Why `splatq ARGS` would be refused before doing anything (argparse's message, or a bad
    --stages list), or None when the CLI accepts it."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            ns: argparse.Namespace = cli._parser().parse_args(args)
    except SystemExit as exc:
        return f"exit {exc.code}: {err.getvalue().strip()}" if exc.code else None
    if getattr(ns, "stages", None) is not None:
        try:
            parse_stage_list(ns.stages)
        except ValueError as exc:
            return f"--stages: {exc}"
    if ns.command not in cli._COMMANDS:
        return f"no handler for {ns.command!r}"
    return None


# -- the environment a container gets -----------------------------------------------------------


@cache
def settings_variables() -> frozenset[str]:
    """The variables Settings reads: every declared setting's (shared/settings/)."""
    names = declared_variables()
    assert "SPLATQ_REDIS_URL" in names  # the declarations are there
    return names


def unknown_variables(names: set[str] | frozenset[str]) -> set[str]:
    allowed = settings_variables() | RUNTIME_VARIABLES | AWS_SDK_VARIABLES | KEDA_VARIABLES
    return set(names) - allowed


def _source_data(doc: dict[str, Any]) -> dict[str, str]:
    data = dict(doc.get("stringData") or {})
    for key, value in (doc.get("data") or {}).items():
        data[key] = base64.b64decode(value).decode() if doc["kind"] == "Secret" else value
    return data


def container_environment(
    docs: tuple[dict[str, Any], ...], container: dict[str, Any]
) -> tuple[dict[str, str], list[str]]:
    """The variables a container starts with (envFrom sources found in the build, in order,
    then env), and the envFrom sources the build does not hold (the user's Secret)."""
    env: dict[str, str] = {}
    missing = []
    for source in container.get("envFrom", []):
        kind, ref = (
            ("ConfigMap", source["configMapRef"])
            if "configMapRef" in source
            else ("Secret", source["secretRef"])
        )
        found = objects_of(docs, kind).get(ref["name"])
        if found is None:
            missing.append(f"{kind}/{ref['name']}")
        else:
            env.update(_source_data(found))
    for var in container.get("env", []):
        env[var["name"]] = var.get("value", "")
    return env, missing


# -- restricted Pod Security Standard ------------------------------------------------------------

RESTRICTED_VOLUME_TYPES = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
    }
)


def restricted_violations(spec: Mapping[str, Any]) -> list[str]:
    """What in a pod spec the `restricted` Pod Security Standard (baseline included, policy
    version `latest`) refuses, as the admission controller would list it; [] when it passes."""
    problems = [f"{key}: true" for key in ("hostNetwork", "hostPID", "hostIPC") if spec.get(key)]
    pod_sc = spec.get("securityContext") or {}
    for volume in spec.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUME_TYPES:
            problems.append(f"volume {volume['name']}: type {sorted(kinds)}")
    for sysctl in pod_sc.get("sysctls", []):
        if sysctl["name"] not in SAFE_SYSCTLS:
            problems.append(f"sysctl {sysctl['name']}")
    problems += _selinux_and_seccomp("pod", pod_sc)
    if pod_sc.get("runAsUser") == 0:
        problems.append("pod: runAsUser 0")
    containers = [
        *spec.get("initContainers", []),
        *spec["containers"],
        *spec.get("ephemeralContainers", []),
    ]
    for c in containers:
        problems += [f"{c['name']}: {p}" for p in _container_violations(c, pod_sc)]
    return problems


def _selinux_and_seccomp(where: str, sc: Mapping[str, Any]) -> list[str]:
    problems = []
    selinux = sc.get("seLinuxOptions") or {}
    if selinux.get("type", "") not in {"", "container_t", "container_init_t", "container_kvm_t"}:
        problems.append(f"{where}: seLinuxOptions.type {selinux['type']}")
    if selinux.get("user") or selinux.get("role"):
        problems.append(f"{where}: seLinuxOptions user/role")
    seccomp = (sc.get("seccompProfile") or {}).get("type")
    if seccomp not in {None, "RuntimeDefault", "Localhost"}:
        problems.append(f"{where}: seccompProfile {seccomp}")
    apparmor = (sc.get("appArmorProfile") or {}).get("type")
    if apparmor not in {None, "RuntimeDefault", "Localhost"}:
        problems.append(f"{where}: appArmorProfile {apparmor}")
    return problems


def _container_violations(c: Mapping[str, Any], pod_sc: Mapping[str, Any]) -> list[str]:
    sc = c.get("securityContext") or {}
    problems = _selinux_and_seccomp("container", sc)
    if sc.get("privileged"):
        problems.append("privileged")
    if sc.get("procMount", "Default") != "Default":
        problems.append(f"procMount {sc['procMount']}")
    if any(p.get("hostPort") for p in c.get("ports", [])):
        problems.append("hostPort")
    if sc.get("allowPrivilegeEscalation") is not False:
        problems.append("allowPrivilegeEscalation must be false")
    caps = sc.get("capabilities") or {}
    if "ALL" not in (caps.get("drop") or []):
        problems.append("capabilities.drop must include ALL")
    if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
        problems.append(f"capabilities.add {caps['add']}")
    run_as_non_root = sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot"))
    if run_as_non_root is not True:
        problems.append("runAsNonRoot must be true (pod or container)")
    if sc.get("runAsUser") == 0:
        problems.append("runAsUser 0")
    seccomp = (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type")
    if seccomp not in {"RuntimeDefault", "Localhost"}:
        problems.append("seccompProfile must be RuntimeDefault or Localhost (pod or container)")
    return problems
