"""The k8s/ manifests, alert rules and dashboard agree with the code: they parse, name only
real settings, metrics and HTTP routes, and keep shutdown, ports, probes and labels of the
workers (the staged pipeline's GPU and CPU kinds), the gateway and the webhook dispatcher
consistent. The KEDA and Prometheus Operator objects are validated against those projects'
CRD schemas (the generated models of the cloudcoil-models-* packages, offline).

File checks: no cluster, kubectl or network. Where `promtool` is installed, the alert
expressions and dashboard queries are also parsed by it and the alerts are exercised with
`promtool test rules` (tests/k8s/alerts.promtool.yaml); otherwise those skip.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from cloudcoil.models.keda.v1alpha1 import ScaledObject, TriggerAuthentication
from cloudcoil.models.prometheus_operator.v1 import PodMonitor, PrometheusRule
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from pydantic import BaseModel, ValidationError

from splatq.services.gateway.app import create_app
from splatq.services.gateway.metrics import GatewayMetrics
from splatq.services.gpu_worker.metrics import GpuMetrics
from splatq.services.gpu_worker.oom import CUDA_OUT_OF_MEMORY
from splatq.services.gpu_worker.remote.metrics import UpstreamMetrics
from splatq.services.stack import ALL_WORKERS, WORKER_STAGES
from splatq.services.webhook_dispatcher.metrics import DispatcherMetrics
from splatq.shared.engine.keys import STREAMS, StreamName
from splatq.shared.engine.metrics import EngineMetrics, register_build_info
from splatq.shared.engine.stages import ALL_STAGES, DEVICE_STAGES, PIPELINE, parse_stage_list
from splatq.shared.engine.worker_classes import parse_class_list
from splatq.shared.maintenance.metrics import RedriverMetrics
from splatq.shared.settings import Settings, declared_variables

REPO_ROOT = Path(__file__).resolve().parents[2]
K8S = REPO_ROOT / "k8s"
BASE = K8S / "base"
CONFIGMAP = BASE / "configmap.yaml"
SECRET_EXAMPLE = BASE / "secret.example.yaml"
WORKER_GPU = BASE / "worker-gpu-deployment.yaml"
WORKER_CPU_INTERACTIVE = BASE / "worker-cpu-interactive-deployment.yaml"
WORKER_CPU_SYNTHESIS = BASE / "worker-cpu-synthesis-deployment.yaml"
# Each worker Deployment and the `splatq up` process whose stages and classes it runs.
WORKER_KINDS = {
    WORKER_GPU: "worker-gpu",
    WORKER_CPU_INTERACTIVE: "worker-cpu-interactive",
    WORKER_CPU_SYNTHESIS: "worker-cpu-synthesis",
}
WORKER_CPUS = (WORKER_CPU_INTERACTIVE, WORKER_CPU_SYNTHESIS)
WORKERS = tuple(WORKER_KINDS)
GATEWAY = BASE / "gateway-deployment.yaml"
GATEWAY_SERVICE = BASE / "gateway-service.yaml"
DISPATCHER = BASE / "dispatcher-deployment.yaml"
REDRIVER = BASE / "redriver-deployment.yaml"
SETTLER = BASE / "settler-deployment.yaml"
PODMONITOR = BASE / "podmonitor.yaml"
GPU_PATCH = K8S / "overlays" / "gpu" / "worker-gpu-patch.yaml"
KEDA = K8S / "autoscaling" / "keda-scaledobject.yaml"
KEDA_CLUSTER_EXAMPLE = K8S / "examples" / "redis-cluster" / "keda-scaledobject.yaml"
RULES = K8S / "monitoring" / "prometheusrule.yaml"
DASHBOARD = K8S / "monitoring" / "grafana-dashboard.json"
OPERATIONS_DOC = REPO_ROOT / "docs" / "operations.md"
PROMTOOL_TESTS = Path(__file__).with_name("alerts.promtool.yaml")
DEPLOYMENTS = (*WORKERS, GATEWAY, DISPATCHER, REDRIVER, SETTLER)
PROMTOOL = shutil.which("promtool")

YAML_FILES = sorted(p for p in K8S.rglob("*") if p.suffix in {".yaml", ".yml"})
DS_VARIABLE = "${DS_PROMETHEUS}"
METRIC_NAME = re.compile(r"\bsplatq_[a-z0-9_]+")
# Series the dashboard reads from other exporters: NVIDIA's DCGM exporter (GPU utilisation).
EXTERNAL_METRIC = re.compile(r"\bDCGM_FI_[A-Z0-9_]+")
EXTERNAL_METRICS = {"DCGM_FI_DEV_GPU_UTIL"}
RUNBOOK = re.compile(r"^docs/operations\.md#([a-z0-9-]+)$")
RUNBOOK_ANCHORS = {
    "lost-entries",
    "dead-letters",
    "stuck-jobs",
    "lease-renewal-failures",
    "backlog",
    "retry-storm",
    "workers-down",
    "gateway-errors",
    "gateway-latency",
    "gpu-oom",
    "webhooks",
    "webhook-deliveries-late",
    "webhook-endpoint-disabled",
    "webhook-circuits-open",
    "redis-error-replies",
    "sse-streams-refused",
    "redriver",
    "settler",
    "scheduled-tasks",
    "dead-letters-waiting",
    "expired-leases",
    "stream-bounds",
    "stage-waiting",
    "stage-failures",
}
REQUIRED_ALERTS = {
    "SplatqStreamEntriesLost",
    "SplatqDeadLettersGrowing",
    "SplatqOldestPendingTooOld",
    "SplatqLeaseRenewalFailures",
    "SplatqQueueBacklogHigh",
    "SplatqRetryStorm",
    "SplatqWorkersDown",
    "SplatqGatewayErrors",
    "SplatqGatewaySlow",
    "SplatqGpuOutOfMemory",
    "SplatqWebhookDeadLetters",
    "SplatqWebhookBacklog",
    "SplatqWebhookFailures",
    "SplatqWebhookDeliveriesLate",
    "SplatqWebhookEndpointDisabled",
    "SplatqWebhookCircuitsOpen",
    "SplatqRedisErrorReplies",
    "SplatqSseStreamsRefused",
    "SplatqTaskNotSucceeding",
    "SplatqRedriverDown",
    "SplatqSettlerDown",
    "SplatqDeadLettersWaiting",
    "SplatqRedrivesFailing",
    "SplatqExpiredLeasesUnreclaimed",
    "SplatqStreamNearBound",
    "SplatqStageWaitingTooLong",
    "SplatqStageRunsFailing",
}
# The webhook endpoint and circuit breaker settings (variable -> Settings field).
WEBHOOK_ENDPOINT_SETTINGS = {
    "SPLATQ_WEBHOOK_MAX_ENDPOINTS": "webhook_max_endpoints",
    "SPLATQ_WEBHOOK_ROTATION_OVERLAP_S": "webhook_rotation_overlap_s",
    "SPLATQ_WEBHOOK_RECOVER_LIMIT": "webhook_recover_limit",
    "SPLATQ_WEBHOOK_BREAKER_CONSECUTIVE": "webhook_breaker_consecutive",
    "SPLATQ_WEBHOOK_BREAKER_RATIO": "webhook_breaker_ratio",
    "SPLATQ_WEBHOOK_BREAKER_MIN_ATTEMPTS": "webhook_breaker_min_attempts",
    "SPLATQ_WEBHOOK_BREAKER_WINDOW_MS": "webhook_breaker_window_ms",
    "SPLATQ_WEBHOOK_BREAKER_OPEN_MS": "webhook_breaker_open_ms",
    "SPLATQ_WEBHOOK_BREAKER_OPEN_CAP_MS": "webhook_breaker_open_cap_ms",
    "SPLATQ_WEBHOOK_DISABLE_AFTER_S": "webhook_disable_after_s",
}
# Non-secret AWS SDK variables the ConfigMap may carry besides SPLATQ_* settings.
AWS_SDK_SETTINGS = {"AWS_REGION", "AWS_DEFAULT_REGION"}
# Grafana's variables, replaced by plain PromQL to let promtool parse the dashboard queries.
GRAFANA_VARIABLES = {
    "$__rate_interval": "5m",
    "$namespace": ".*",
    "$stream": ".*",
    "$partition": ".*",
}
# Sample names prometheus_client exposes per metric type (the family name drops `_total`).
SAMPLE_SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "info": ("_info",),
}


def load_docs(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        return [doc for doc in yaml.safe_load_all(f) if doc is not None]


def only_doc(path: Path, kind: str) -> dict[str, Any]:
    docs = [d for d in load_docs(path) if d.get("kind") == kind]
    assert len(docs) == 1, f"{path.relative_to(REPO_ROOT)}: expected one {kind}, got {len(docs)}"
    return docs[0]


def configmap_data() -> dict[str, Any]:
    data: dict[str, Any] = only_doc(CONFIGMAP, "ConfigMap")["data"]
    return data


def secret_example_data() -> dict[str, Any]:
    secret = only_doc(SECRET_EXAMPLE, "Secret")
    data: dict[str, Any] = secret.get("stringData") or secret.get("data") or {}
    return data


def pod_spec(path: Path) -> dict[str, Any]:
    spec: dict[str, Any] = only_doc(path, "Deployment")["spec"]["template"]["spec"]
    return spec


def pod_labels(path: Path) -> dict[str, str]:
    labels: dict[str, str] = only_doc(path, "Deployment")["spec"]["template"]["metadata"]["labels"]
    return labels


def container_of(path: Path, name: str) -> dict[str, Any]:
    containers = {c["name"]: c for c in pod_spec(path)["containers"]}
    container: dict[str, Any] = containers[name]
    return container


def worker_container(path: Path = WORKER_GPU) -> dict[str, Any]:
    return container_of(path, "worker")


def gateway_container() -> dict[str, Any]:
    return container_of(GATEWAY, "gateway")


def dispatcher_container() -> dict[str, Any]:
    return container_of(DISPATCHER, "dispatcher")


def port_names(path: Path) -> set[str]:
    return {p["name"] for c in pod_spec(path)["containers"] for p in c.get("ports", [])}


def pre_stop_seconds(container: dict[str, Any]) -> int:
    """Seconds the container's preStop hook sleeps (`sleep` action or `exec: sleep N`)."""
    hook = (container.get("lifecycle") or {}).get("preStop") or {}
    if "sleep" in hook:
        return int(hook["sleep"]["seconds"])
    command = (hook.get("exec") or {}).get("command") or []
    if command and command[0] in {"sleep", "/bin/sleep"}:
        return int(command[1])
    return 0


def configured_settings() -> Settings:
    """The settings every splatq pod starts with: the ConfigMap with the example Secret on top."""
    return Settings.from_env({**configmap_data(), **secret_example_data()})


@cache
def gateway_routes() -> frozenset[tuple[str, str]]:
    """(method, path) of every route of the real gateway app, built with the deployed settings.

    `create_app` opens Redis only in its cleanup_ctx, so building it (never starting it) needs
    no server; a fresh registry keeps its metrics out of the global one.
    """
    app = create_app(configured_settings(), registry=CollectorRegistry())
    return frozenset((r.method, r.resource.canonical) for r in app.router.routes() if r.resource)


def get_paths() -> set[str]:
    return {path for method, path in gateway_routes() if method == "GET"}


def pod_monitors() -> list[dict[str, Any]]:
    return [d for d in load_docs(PODMONITOR) if d["kind"] == "PodMonitor"]


def scrapes_of(path: Path) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(PodMonitor, endpoint) pairs that produce a target for the Deployment's pods: the
    monitor selects the pod and the endpoint names one of its ports."""
    labels, ports = pod_labels(path), port_names(path)
    return [
        (monitor, endpoint)
        for monitor in pod_monitors()
        if label_subset(monitor["spec"]["selector"]["matchLabels"], labels)
        for endpoint in monitor["spec"]["podMetricsEndpoints"]
        if endpoint["port"] in ports
    ]


def job_label_of(path: Path) -> str:
    """The `job` label Prometheus gives the Deployment's targets (its PodMonitor's jobLabel)."""
    ((monitor, _),) = scrapes_of(path)
    return pod_labels(path)[monitor["spec"]["jobLabel"]]


def env_names_read_by_settings() -> set[str]:
    """The variables `from_env` reads: every declared setting's (shared/settings/)."""
    names = set(declared_variables())
    assert "SPLATQ_REDIS_URL" in names  # the declarations are there
    return names


def exposed_sample_names(registry: CollectorRegistry) -> set[str]:
    names: set[str] = set()
    for family in registry.collect():
        names.update(family.name + suffix for suffix in SAMPLE_SUFFIXES[family.type])
        names.update(sample.name for sample in family.samples)
    return names


METRIC_CLASSES = (
    EngineMetrics, GatewayMetrics, GpuMetrics, DispatcherMetrics, RedriverMetrics, UpstreamMetrics,
)  # fmt: skip


def metric_registries() -> list[CollectorRegistry]:
    """One fresh registry per metrics class (the gateway shares EngineMetrics' names, and one
    registry would refuse duplicates)."""
    registries = []
    for metrics_class in METRIC_CLASSES:
        registry = CollectorRegistry()
        metrics_class.create(registry)
        registries.append(registry)
    build_info = CollectorRegistry()
    register_build_info(build_info, "test")
    return [*registries, build_info]


def exposed_metric_names() -> set[str]:
    """Every sample name EngineMetrics, GatewayMetrics, GpuMetrics and DispatcherMetrics expose."""
    return set().union(*(exposed_sample_names(r) for r in metric_registries()))


def alert_rules() -> list[dict[str, Any]]:
    groups = only_doc(RULES, "PrometheusRule")["spec"]["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return loaded


def dashboard_panels(panels: list[dict[str, Any]] | None = None) -> Iterator[dict[str, Any]]:
    for panel in dashboard()["panels"] if panels is None else panels:
        yield panel
        yield from dashboard_panels(panel.get("panels", []))


def dashboard_exprs() -> list[str]:
    return [t["expr"] for p in dashboard_panels() for t in p.get("targets", [])]


def all_exprs() -> list[str]:
    return dashboard_exprs() + [r["expr"] for r in alert_rules()]


def rule_groups_for_promtool(*, annotations: bool = True) -> dict[str, Any]:
    """The PrometheusRule's groups as a plain Prometheus rules file."""
    groups = only_doc(RULES, "PrometheusRule")["spec"]["groups"]
    if not annotations:
        groups = [
            {**g, "rules": [{k: v for k, v in r.items() if k != "annotations"} for r in g["rules"]]}
            for g in groups
        ]
    return {"groups": groups}


def run_promtool(*args: str, cwd: Path) -> None:
    assert PROMTOOL
    result = subprocess.run(
        [PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def label_subset(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


# -- files and structure ------------------------------------------------------------------------


def test_manifest_tree_is_complete() -> None:
    """Every file the deployment docs point at exists."""
    expected = [
        BASE / "kustomization.yaml",
        BASE / "namespace.yaml",
        CONFIGMAP,
        SECRET_EXAMPLE,
        *WORKERS,
        GATEWAY,
        GATEWAY_SERVICE,
        DISPATCHER,
        REDRIVER,
        SETTLER,
        BASE / "networkpolicy.yaml",
        PODMONITOR,
        K8S / "overlays" / "gpu" / "kustomization.yaml",
        GPU_PATCH,
        KEDA,
        K8S / "monitoring" / "kustomization.yaml",
        RULES,
        DASHBOARD,
        K8S / "README.md",
        OPERATIONS_DOC,
        PROMTOOL_TESTS,
    ]
    missing = [str(p.relative_to(REPO_ROOT)) for p in expected if not p.is_file()]
    assert not missing


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: str(p.relative_to(K8S)))
def test_every_yaml_document_parses_and_is_named(path: Path) -> None:
    """Each YAML document under k8s/ parses and has apiVersion, kind and metadata.name."""
    docs = load_docs(path)
    assert docs, "no documents"
    for doc in docs:
        assert isinstance(doc, dict)
        assert doc.get("apiVersion"), doc
        assert doc.get("kind"), doc
        assert (doc.get("metadata") or {}).get("name"), doc


RECOMMENDED_LABELS = ("instance", "version", "managed-by", "part-of")


def package_version() -> str:
    pyproject = (REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8")
    found = re.search(r'^version = "([^"]+)"', pyproject, re.M)
    assert found
    return found.group(1)


@pytest.mark.parametrize(
    "folder", ["base", "monitoring", "autoscaling", "overlays/dev", "overlays/gpu"]
)
def test_kustomizations_apply_the_recommended_labels(folder: str) -> None:
    """Every object a kustomization applies gets app.kubernetes.io/{instance,version,
    managed-by,part-of}; version is the package's (and the image tag's)."""
    kustomization = yaml.safe_load((K8S / folder / "kustomization.yaml").read_text())
    pairs: dict[str, str] = {}
    for entry in kustomization["labels"]:
        assert entry.get("includeSelectors") is False  # selectors are immutable
        pairs.update(entry["pairs"])
    for label in RECOMMENDED_LABELS:
        assert f"app.kubernetes.io/{label}" in pairs, (folder, label)
    assert pairs["app.kubernetes.io/version"] == package_version()
    if folder == "base":
        assert kustomization["images"][0]["newTag"] == package_version()


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: str(p.relative_to(K8S)))
def test_every_object_names_its_app(path: Path) -> None:
    """app.kubernetes.io/name on every object (the other recommended labels come from the
    kustomizations)."""
    for doc in yaml.safe_load_all(path.read_text()):
        if not doc or doc.get("kind") in {"Kustomization"} or "metadata" not in doc:
            continue
        if "overlays" in path.parts and path.name.endswith("-patch.yaml"):
            continue  # a patch: its target keeps its own labels
        labels = doc["metadata"].get("labels", {})
        assert "app.kubernetes.io/name" in labels, (path, doc["metadata"].get("name"))


@pytest.mark.parametrize(
    "path",
    [
        "worker-gpu-deployment.yaml",
        "worker-cpu-interactive-deployment.yaml",
        "worker-cpu-synthesis-deployment.yaml",
        "dispatcher-deployment.yaml",
        "redriver-deployment.yaml",
    ],
)
def test_liveness_probes_watch_the_event_loop(path: str) -> None:
    """Liveness of the asyncio services is /livez (the loop's heartbeat), not /metrics."""
    deployment = only_doc(BASE / path, "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "metrics"}


def test_kustomizations_reference_existing_files() -> None:
    """Resources, patches and generator files named by each kustomization exist."""
    kustomizations = [p for p in YAML_FILES if p.name == "kustomization.yaml"]
    assert len(kustomizations) >= 4
    for path in kustomizations:
        k = only_doc(path, "Kustomization")
        referenced = list(k.get("resources", []))
        referenced += [p["path"] for p in k.get("patches", []) if "path" in p]
        for gen in k.get("configMapGenerator", []):
            referenced += [f.rpartition("=")[2] for f in gen.get("files", [])]
        for ref in referenced:
            assert (path.parent / ref).exists(), f"{path.relative_to(REPO_ROOT)} -> {ref}"


KUBECTL = shutil.which("kubectl")


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")
@pytest.mark.parametrize(
    "folder", ["base", "overlays/gpu", "overlays/dev", "autoscaling", "monitoring"]
)
def test_kustomizations_build(folder: str) -> None:
    """`kubectl kustomize` (offline) builds each kustomization; in the GPU overlay's output the
    GPU worker, and only it, takes a GPU and runs on CUDA."""
    assert KUBECTL
    result = subprocess.run(
        [KUBECTL, "kustomize", str(K8S / folder)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert docs
    if folder != "overlays/gpu":
        return
    gpu_takers = set()
    for d in docs:
        if d["kind"] != "Deployment":
            continue
        for c in d["spec"]["template"]["spec"]["containers"]:
            if "nvidia.com/gpu" in c.get("resources", {}).get("limits", {}):
                gpu_takers.add(d["metadata"]["name"])
                env = {e["name"]: e.get("value") for e in c.get("env", [])}
                assert env["SPLATQ_DEVICE"] == "cuda"
                assert c["command"][-1] == "reconstruct"
    assert gpu_takers == {only_doc(WORKER_GPU, "Deployment")["metadata"]["name"]}


def test_base_applies_every_manifest_but_the_secret_example() -> None:
    """The base lists each of its manifests except the example Secret, which it must not apply."""
    resources = set(only_doc(BASE / "kustomization.yaml", "Kustomization")["resources"])
    assert SECRET_EXAMPLE.name not in resources
    manifests = {p.name for p in BASE.glob("*.yaml")} - {"kustomization.yaml", SECRET_EXAMPLE.name}
    assert manifests == resources
    assert {GATEWAY.name, GATEWAY_SERVICE.name, DISPATCHER.name, REDRIVER.name} <= resources


def test_base_object_names_are_unique_per_kind() -> None:
    """No two base objects of one kind share a name (kustomize would refuse to build)."""
    resources = only_doc(BASE / "kustomization.yaml", "Kustomization")["resources"]
    ids = [(d["kind"], d["metadata"]["name"]) for r in resources for d in load_docs(BASE / r)]
    assert len(ids) == len(set(ids)), ids


# -- settings ----------------------------------------------------------------------------------


def test_configmap_keys_are_real_settings() -> None:
    """Every SPLATQ_* key in the ConfigMap is a variable Settings.from_env reads; the only
    other keys allowed are the AWS SDK's non-secret region variables."""
    known = env_names_read_by_settings()
    keys = set(configmap_data())
    assert keys, "empty ConfigMap"
    settings_keys = {k for k in keys if k.startswith("SPLATQ_")}
    assert keys - settings_keys <= AWS_SDK_SETTINGS, sorted(keys - settings_keys)
    assert settings_keys <= known, sorted(settings_keys - known)


def test_configmap_sets_the_gateway_and_worker_settings() -> None:
    """The settings the gateway, GPU worker and webhook dispatcher added are set explicitly in
    the ConfigMap."""
    required = {
        "SPLATQ_STORAGE_URL",
        "SPLATQ_S3_ENDPOINT_URL",
        "SPLATQ_PUBLIC_URL",
        "SPLATQ_GATEWAY_HOST",
        "SPLATQ_GATEWAY_PORT",
        "SPLATQ_MAX_UPLOAD_BYTES",
        "SPLATQ_MAX_IMAGE_PIXELS",
        "SPLATQ_RATE_LIMIT_PER_S",
        "SPLATQ_RATE_LIMIT_BURST",
        "SPLATQ_MAX_BACKLOG_INTERACTIVE",
        "SPLATQ_MAX_BACKLOG_SYNTHESIS",
        "SPLATQ_SSE_KEEPALIVE_S",
        "SPLATQ_MODEL",
        "SPLATQ_MODEL_CHECKPOINT",
        "SPLATQ_BATCH_MAX_SIZE",
        "SPLATQ_BATCH_MAX_WAIT_MS",
        "SPLATQ_BATCH_MAX_PIXELS",
        "SPLATQ_WEBHOOK_ALLOW_PRIVATE",
        "SPLATQ_WEBHOOK_MAX_ATTEMPTS",
        "SPLATQ_WEBHOOK_RETRY_BASE_MS",
        "SPLATQ_WEBHOOK_RETRY_CAP_MS",
        "SPLATQ_WEBHOOK_TIMEOUT_S",
        "SPLATQ_WEBHOOK_CONCURRENCY",
        "SPLATQ_WEBHOOK_CONCURRENCY_PER_HOST",
        "SPLATQ_WEBHOOK_CONCURRENCY_PER_ENDPOINT",
        "SPLATQ_STAGE_CONCURRENCY",
        "SPLATQ_STAGE_MAX_ATTEMPTS",
        "SPLATQ_STAGE_TIMEOUT_S",
        "SPLATQ_STAGE_BUFFER",
        *WEBHOOK_ENDPOINT_SETTINGS,
    }
    assert not required - set(configmap_data()), sorted(required - set(configmap_data()))


def test_configmap_webhook_endpoint_settings_are_the_defaults() -> None:
    """The endpoint limit, secret rotation overlap, recover bound, circuit breaker and
    auto-disable settings are in the ConfigMap with the defaults docs/webhooks.md documents."""
    configured, defaults = configured_settings(), Settings()
    for name, field in WEBHOOK_ENDPOINT_SETTINGS.items():
        assert getattr(configured, field) == getattr(defaults, field), name


def test_secret_example_keys_are_real_settings() -> None:
    """The example Secret carries the Redis URL and API keys, and its SPLATQ_* keys are real."""
    known = env_names_read_by_settings()
    keys = {k for k in secret_example_data() if k.startswith("SPLATQ_")}
    assert {"SPLATQ_REDIS_URL", "SPLATQ_API_KEYS"} <= keys
    assert keys <= known, sorted(keys - known)


def test_secrets_stay_out_of_the_configmap() -> None:
    """Credentials are only in the Secret, never in the ConfigMap."""
    secret_keys = {
        "SPLATQ_REDIS_URL",
        "SPLATQ_API_KEYS",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "KEDA_REDIS_PASSWORD",
    }
    assert not secret_keys & set(configmap_data())


def test_configmap_values_are_strings() -> None:
    """ConfigMap data values are quoted strings, as the Kubernetes API requires."""
    bad = {k: v for k, v in configmap_data().items() if not isinstance(v, str)}
    assert not bad


def test_settings_accept_the_configmap_and_secret_example() -> None:
    """Settings.from_env accepts the ConfigMap alone and with the example Secret on top."""
    data = configmap_data()
    settings = Settings.from_env(data)
    assert settings.metrics_port == 9100
    assert settings.log_format == "json"
    combined = configured_settings()
    assert not combined.redis_url_is_default
    assert combined.api_keys


def test_storage_is_shared_object_storage() -> None:
    """Pods share no filesystem: storage is s3://bucket[/prefix], and artifact links use an
    external https base URL rather than the gateway's own pod address."""
    settings = configured_settings()
    assert re.fullmatch(r"s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[^/].*)?", settings.storage_url)
    assert settings.public_url.startswith("https://")
    assert settings.public_base_url == settings.public_url


def test_settings_accept_the_gpu_overlay() -> None:
    """The GPU overlay's env on top of the ConfigMap is valid and selects CUDA."""
    patch = only_doc(GPU_PATCH, "Deployment")
    container = next(c for c in patch["spec"]["template"]["spec"]["containers"])
    env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    assert all(k in env_names_read_by_settings() for k in env if k.startswith("SPLATQ_"))
    assert Settings.from_env({**configmap_data(), **env}).device == "cuda"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_only_the_gpu_worker_takes_a_gpu() -> None:
    """The GPU overlay patches the GPU worker Deployment (the reconstruct stage) and nothing
    else, its container by the base's name; no base Deployment requests a GPU."""
    overlay = only_doc(K8S / "overlays" / "gpu" / "kustomization.yaml", "Kustomization")
    gpu_name = only_doc(WORKER_GPU, "Deployment")["metadata"]["name"]
    [gpu_patch] = [p for p in overlay["patches"] if p.get("path") == GPU_PATCH.name]
    assert gpu_patch["target"]["name"] == gpu_name
    assert not [p for p in overlay["patches"] if "nvidia.com/gpu" in p.get("patch", "")]
    patch = only_doc(GPU_PATCH, "Deployment")
    assert patch["metadata"]["name"] == gpu_name
    patched = {c["name"] for c in patch["spec"]["template"]["spec"]["containers"]}
    assert patched == {c["name"] for c in pod_spec(WORKER_GPU)["containers"]}
    for path in DEPLOYMENTS:
        for c in pod_spec(path)["containers"]:
            resources = c.get("resources", {})
            for kind in ("requests", "limits"):
                assert "nvidia.com/gpu" not in resources.get(kind, {}), (path.name, c["name"])


def test_webhooks_cannot_reach_private_addresses() -> None:
    """Production keeps the SSRF guard on: SPLATQ_WEBHOOK_ALLOW_PRIVATE is "0" in the
    ConfigMap, and no Secret key, container env or overlay patch overrides it."""
    assert configmap_data()["SPLATQ_WEBHOOK_ALLOW_PRIVATE"] == "0"
    assert configured_settings().webhook_allow_private is False
    assert "SPLATQ_WEBHOOK_ALLOW_PRIVATE" not in secret_example_data()
    for path in (*DEPLOYMENTS, GPU_PATCH):
        containers = only_doc(path, "Deployment")["spec"]["template"]["spec"]["containers"]
        names = {e["name"] for c in containers for e in c.get("env", [])}
        assert "SPLATQ_WEBHOOK_ALLOW_PRIVATE" not in names, path.name


def test_webhook_attempts_fit_in_the_drain() -> None:
    """A draining dispatcher waits SPLATQ_SHUTDOWN_GRACE_S for its attempts in flight, each of
    which lasts at most SPLATQ_WEBHOOK_TIMEOUT_S; per-host concurrency fits in the total."""
    settings = configured_settings()
    assert settings.webhook_timeout_s < settings.shutdown_grace_s
    assert settings.webhook_concurrency_per_host <= settings.webhook_concurrency
    assert settings.webhook_concurrency_per_endpoint <= settings.webhook_concurrency_per_host


# -- Deployments -------------------------------------------------------------------------------


@pytest.mark.parametrize("path", DEPLOYMENTS, ids=lambda p: p.stem)
def test_termination_grace_exceeds_shutdown_grace(path: Path) -> None:
    """The kubelet waits at least 10 s longer than the preStop sleep plus the SIGTERM drain."""
    grace = configured_settings().shutdown_grace_s
    pod = pod_spec(path)
    pre_stop = max(pre_stop_seconds(c) for c in pod["containers"])
    assert pod["terminationGracePeriodSeconds"] >= pre_stop + grace + 10


@pytest.mark.parametrize("path", DEPLOYMENTS, ids=lambda p: p.stem)
def test_containers_load_config_then_secret(path: Path) -> None:
    """Every splatq container takes the ConfigMap and then the Secret (which wins) by envFrom."""
    cm_name = only_doc(CONFIGMAP, "ConfigMap")["metadata"]["name"]
    secret_name = only_doc(SECRET_EXAMPLE, "Secret")["metadata"]["name"]
    for container in pod_spec(path)["containers"]:
        refs = [
            (e.get("configMapRef") or e.get("secretRef") or {}).get("name")
            for e in container["envFrom"]
        ]
        assert refs == [cm_name, secret_name], container["name"]


@pytest.mark.parametrize("path", WORKERS, ids=lambda p: p.stem)
def test_worker_container_is_wired_to_config_and_metrics(path: Path) -> None:
    """Each worker runs `splatq worker --stages ...` and probes its metrics port."""
    container = worker_container(path)
    assert container["command"][:3] == ["splatq", "worker", "--stages"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["metrics"] == int(configmap_data()["SPLATQ_METRICS_PORT"])
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["port"] == "metrics", probe
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


def worker_stages(path: Path) -> tuple[Any, ...]:
    command = worker_container(path)["command"]
    assert command[:3] == ["splatq", "worker", "--stages"], command
    assert len(command) in (4, 6), command
    return parse_stage_list(command[3])


def worker_classes(path: Path) -> tuple[StreamName, ...]:
    """The classes a worker Deployment serves (`--classes`, else both)."""
    command = worker_container(path)["command"]
    if len(command) == 4:
        return STREAMS
    assert command[4] == "--classes", command
    return parse_class_list(command[5])


def test_the_worker_kinds_run_every_stage_once() -> None:
    """The GPU worker runs the device stages for both classes (one device, one scheduler),
    a CPU worker per class every other stage (cleanup too): each stage of each class has
    exactly one kind of pod, the same split as `splatq up`'s processes (ALL_WORKERS)."""
    gpu = worker_stages(WORKER_GPU)
    assert set(gpu) == DEVICE_STAGES
    assert worker_classes(WORKER_GPU) == STREAMS
    assert {c for p in WORKER_CPUS for c in worker_classes(p)} == set(STREAMS)
    for path in WORKER_CPUS:
        cpu = worker_stages(path)
        assert len(worker_classes(path)) == 1, path
        assert not set(gpu) & set(cpu)
        assert set(gpu) | set(cpu) == set(ALL_STAGES)
    for path, name in WORKER_KINDS.items():
        process = ALL_WORKERS[name]
        assert worker_stages(path) == WORKER_STAGES[process.kind], name
        assert worker_classes(path) == process.classes, name
    # SPLATQ_WORKER_CLASSES in the shared ConfigMap would make every worker the same class
    assert "SPLATQ_WORKER_CLASSES" not in configmap_data()
    # SPLATQ_STAGES in the shared ConfigMap would make every worker the same kind
    assert "SPLATQ_STAGES" not in configmap_data()
    assert not configured_settings().stages


@pytest.mark.parametrize("path", WORKERS, ids=lambda p: p.stem)
def test_workers_mirror_each_other(path: Path) -> None:
    """Both worker kinds: same pod and container security context, /tmp emptyDir, drain,
    rollout without a dip, topology spread over their own pods, resources set, and labels
    naming their own Deployment."""
    pod = pod_spec(path)
    assert pod["securityContext"] == pod_spec(WORKER_GPU)["securityContext"]
    assert pod["automountServiceAccountToken"] is False
    assert (
        pod["terminationGracePeriodSeconds"]
        == pod_spec(WORKER_GPU)["terminationGracePeriodSeconds"]
    )
    container = worker_container(path)
    assert container["securityContext"] == worker_container()["securityContext"]
    assert container["envFrom"] == worker_container()["envFrom"]
    assert container["env"] == worker_container()["env"]
    resources = container["resources"]
    assert {"cpu", "memory"} <= set(resources["requests"])
    assert "memory" in resources["limits"]
    assert {m["mountPath"] for m in container["volumeMounts"]} == {"/tmp"}
    deployment = only_doc(path, "Deployment")
    name = deployment["metadata"]["name"]
    assert deployment["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": name}
    assert pod_labels(path)["app.kubernetes.io/name"] == name
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    (spread,) = pod["topologySpreadConstraints"]
    assert spread["labelSelector"]["matchLabels"] == {"app.kubernetes.io/name": name}


def test_gateway_container_serves_on_the_configured_port() -> None:
    """The gateway runs `splatq gateway` on all interfaces at SPLATQ_GATEWAY_PORT, exposed as
    the container port `http` that every probe uses, and /metrics at SPLATQ_METRICS_PORT, the
    container port `metrics`."""
    container = gateway_container()
    assert container["command"] == ["splatq", "gateway"]
    settings = configured_settings()
    assert settings.gateway_host == "0.0.0.0"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": settings.gateway_port, "metrics": settings.metrics_port}
    assert settings.gateway_port == int(configmap_data()["SPLATQ_GATEWAY_PORT"])
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["port"] == "http", probe


def test_gateway_probes_hit_real_routes() -> None:
    """Readiness is /readyz (Redis-aware), liveness and startup /healthz (process only), and
    each probe path is a GET route of the real gateway app."""
    container = gateway_container()
    paths = get_paths()
    probes = {p: container[p]["httpGet"]["path"] for p in ("startupProbe", "readinessProbe")}
    probes["livenessProbe"] = container["livenessProbe"]["httpGet"]["path"]
    assert probes["readinessProbe"] == "/readyz"
    assert probes["livenessProbe"] == "/healthz"
    assert probes["startupProbe"] == "/healthz"
    assert set(probes.values()) <= paths, sorted(set(probes.values()) - paths)
    assert ("POST", "/v1/jobs") in gateway_routes()  # the route set is the real one


def test_gateway_drains_safely() -> None:
    """The gateway sleeps in preStop so endpoints go first, and never runs as a single replica."""
    container = gateway_container()
    assert 1 <= pre_stop_seconds(container) <= 15
    deployment = only_doc(GATEWAY, "Deployment")["spec"]
    assert deployment["replicas"] >= 2
    assert deployment["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def test_gateway_is_hardened_like_the_worker() -> None:
    """Same pod and container security context as the worker, and resources are set."""
    assert pod_spec(GATEWAY)["securityContext"] == pod_spec(WORKER_GPU)["securityContext"]
    container = gateway_container()
    assert container["securityContext"] == worker_container()["securityContext"]
    assert pod_spec(GATEWAY)["automountServiceAccountToken"] is False
    resources = container["resources"]
    assert {"cpu", "memory"} <= set(resources["requests"])  # cpu: an HPA needs a request
    assert "memory" in resources["limits"]
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert "/tmp" in mounts  # the root filesystem is read-only


def test_gateway_service_targets_the_named_port() -> None:
    """The Service selects exactly the gateway pods and sends port 80 to the `http` port."""
    service = only_doc(GATEWAY_SERVICE, "Service")["spec"]
    assert service.get("type", "ClusterIP") == "ClusterIP"
    assert label_subset(service["selector"], pod_labels(GATEWAY))
    (port,) = service["ports"]
    assert port["port"] == 80
    assert port["targetPort"] == "http"
    assert port["targetPort"] in port_names(GATEWAY)
    for other in (*WORKERS, DISPATCHER, REDRIVER):
        assert not label_subset(service["selector"], pod_labels(other)), other.name


def test_dispatcher_container_is_wired_to_config_and_metrics() -> None:
    """The dispatcher runs `splatq dispatcher`, exposes only SPLATQ_METRICS_PORT as `metrics`
    and probes /metrics there for startup and readiness, /livez for liveness."""
    container = dispatcher_container()
    assert container["command"] == ["splatq", "dispatcher"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": configured_settings().metrics_port}
    assert ports["metrics"] == int(configmap_data()["SPLATQ_METRICS_PORT"])
    for probe in ("startupProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/metrics", "port": "metrics"}, probe
    assert container["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "metrics"}


def test_dispatcher_is_hardened_like_the_worker() -> None:
    """Same pod and container security context and /tmp emptyDir as the worker, resources
    set, and at least two replicas that roll without dipping below the replica count."""
    assert pod_spec(DISPATCHER)["securityContext"] == pod_spec(WORKER_GPU)["securityContext"]
    container = dispatcher_container()
    assert container["securityContext"] == worker_container()["securityContext"]
    assert pod_spec(DISPATCHER)["automountServiceAccountToken"] is False
    resources = container["resources"]
    assert {"cpu", "memory"} <= set(resources["requests"])
    assert "memory" in resources["limits"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec(DISPATCHER)["volumes"]}
    assert mounts == {"tmp": "/tmp"}
    assert "emptyDir" in volumes["tmp"]
    deployment = only_doc(DISPATCHER, "Deployment")["spec"]
    assert deployment["replicas"] >= 2
    assert deployment["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


@pytest.mark.parametrize("path", DEPLOYMENTS, ids=lambda p: p.stem)
def test_each_deployment_has_its_own_pdb(path: Path) -> None:
    """Exactly one PodDisruptionBudget selects each Deployment's pods, and it allows one
    voluntary disruption at a time."""
    labels = pod_labels(path)
    pdbs = [
        pdb
        for p in DEPLOYMENTS
        for pdb in load_docs(p)
        if pdb["kind"] == "PodDisruptionBudget"
        and label_subset(pdb["spec"]["selector"]["matchLabels"], labels)
    ]
    assert len(pdbs) == 1, [p["metadata"]["name"] for p in pdbs]
    assert pdbs[0]["spec"].get("maxUnavailable") == 1


# -- scraping ----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", DEPLOYMENTS, ids=lambda p: p.stem)
def test_each_deployment_is_scraped_exactly_once(path: Path) -> None:
    """One PodMonitor endpoint produces a target for each Deployment's pods (two would double
    every summed counter)."""
    scrapes = scrapes_of(path)
    assert len(scrapes) == 1, [(m["metadata"]["name"], e["port"]) for m, e in scrapes]


def test_gateway_is_scraped_on_its_metrics_port() -> None:
    """The gateway is scraped on its `metrics` port (its API port answers 404 for /metrics)
    at a real GET route, /metrics, and its job label is splatq-gateway."""
    ((_, endpoint),) = scrapes_of(GATEWAY)
    assert endpoint["port"] == "metrics"
    assert endpoint["path"] == "/metrics"
    assert endpoint["path"] in get_paths()
    assert job_label_of(GATEWAY) == "splatq-gateway"
    assert job_label_of(WORKER_GPU) == "splatq-worker-gpu"
    assert job_label_of(WORKER_CPU_INTERACTIVE) == "splatq-worker-cpu-interactive"
    assert job_label_of(WORKER_CPU_SYNTHESIS) == "splatq-worker-cpu-synthesis"


@pytest.mark.parametrize("path", [*WORKERS, DISPATCHER], ids=lambda p: p.stem)
def test_metrics_port_deployments_are_scraped_on_it(path: Path) -> None:
    """The workers and the dispatcher are scraped on their `metrics` port at /metrics, with
    their own app name as the job label."""
    ((_, endpoint),) = scrapes_of(path)
    assert endpoint["port"] == "metrics"
    assert endpoint["path"] == "/metrics"
    assert job_label_of(path) == only_doc(path, "Deployment")["metadata"]["name"]


def test_alert_job_labels_match_the_podmonitors() -> None:
    """Every job="..." in the alerts is a job the PodMonitors produce; gateway alerts use the
    gateway's, webhook alerts the dispatcher's, the worker-down alerts one worker kind's
    each, both kinds between them."""
    jobs = {p: job_label_of(p) for p in DEPLOYMENTS}
    used = {j for r in alert_rules() for j in re.findall(r'job="([^"]+)"', r["expr"])}
    assert used == set(jobs.values())
    for rule in alert_rules():
        rule_jobs = set(re.findall(r'job="([^"]+)"', rule["expr"]))
        if rule["alert"].startswith("SplatqGateway"):
            assert rule_jobs == {jobs[GATEWAY]}, rule["alert"]
        if rule["alert"].startswith("SplatqWebhook"):
            assert rule_jobs == {jobs[DISPATCHER]}, rule["alert"]
    down = [
        set(re.findall(r'job="([^"]+)"', r["expr"]))
        for r in alert_rules()
        if r["alert"] == "SplatqWorkersDown" and "up{" in r["expr"]
    ]
    assert sorted(down, key=sorted) == sorted(({jobs[w]} for w in WORKERS), key=sorted)


def test_route_labels_in_queries_are_real_routes() -> None:
    """route="..." matchers and the literal alternatives of route=~ / route!~ regexes in the
    alerts and dashboard name routes the gateway really has."""
    paths = {path for _, path in gateway_routes()}
    seen: set[str] = set()
    for expr in all_exprs():
        for op, value in re.findall(r'route(=~|!~|=|!=)"([^"]*)"', expr):
            alternatives = value.split("|") if op in {"=~", "!~"} else [value]
            seen.update(a for a in alternatives if not any(c in a for c in ".*+?[]()\\"))
    assert {"/v1/jobs", "/healthz", "/readyz", "/metrics"} <= seen
    assert seen <= paths, sorted(seen - paths)


# -- KEDA --------------------------------------------------------------------------------------


def scaled_objects(path: Path = KEDA) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in load_docs(path) if d["kind"] == "ScaledObject"}


STAGE_WORK = re.compile(
    r'^sum\(max by \(stream, partition\) \(splatq_stage_depth\{namespace="splatq", '
    r'(?:stream="(\w+)", )?stage="(\w+)"\}\)\) \+ sum\(max by \(stream, partition\) '
    r'\(splatq_stage_running\{namespace="splatq", (?:stream="(\w+)", )?stage="(\w+)"\}\)\)$'
)


def trigger_stages(scaled: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A ScaledObject's prometheus triggers by the stage whose work (waiting + running, one
    copy per stream and partition) each query sums."""
    out = {}
    for t in scaled["spec"]["triggers"]:
        if t["type"] != "prometheus":
            continue
        found = STAGE_WORK.match(t["metadata"]["query"])
        assert found, t["metadata"]["query"]
        assert found[1] == found[3], t["metadata"]["query"]
        assert found[2] == found[4], t["metadata"]["query"]
        out[found[2]] = t
    return out


def trigger_classes(scaled: dict[str, Any]) -> set[str | None]:
    """The stream="..." filters of a ScaledObject's stage queries (None: both classes)."""
    return {
        STAGE_WORK.match(t["metadata"]["query"])[1]  # type: ignore[index]
        for t in scaled["spec"]["triggers"]
        if t["type"] == "prometheus"
    }


def test_one_scaled_object_per_worker_kind_on_the_stages_it_runs() -> None:
    """One ScaledObject per worker Deployment; its prometheus triggers sum the work of exactly
    the job stages that worker runs (cleanup rides along on the CPU worker), and each
    threshold is one pod's slots of that stage as the ConfigMap sets them."""
    scaled = scaled_objects()
    deployments = {only_doc(p, "Deployment")["metadata"]["name"]: p for p in WORKERS}
    assert set(scaled) == set(deployments)
    settings = configured_settings()
    for name, obj in scaled.items():
        target = obj["spec"]["scaleTargetRef"]
        assert target == {"apiVersion": "apps/v1", "kind": "Deployment", "name": name}
        job_stages = {s.value for s in worker_stages(deployments[name]) if s in PIPELINE}
        triggers = trigger_stages(obj)
        classes = worker_classes(deployments[name])
        # a per-class worker scales on its own class's work only
        assert trigger_classes(obj) == ({None} if classes == STREAMS else {classes[0].value})
        assert set(triggers) == job_stages, name
        assert len(obj["spec"]["triggers"]) == len(triggers)  # prometheus only
        for stage, t in triggers.items():
            meta = t["metadata"]
            assert all(isinstance(v, str) for v in meta.values()), meta  # KEDA wants strings
            assert t["name"] == f"{stage}-work"
            slots = settings.for_stage(stage).worker_concurrency
            assert int(meta["threshold"]) == slots, (name, stage)
            assert meta["activationThreshold"] == "0"
            assert meta["serverAddress"].startswith("http")
        # the stage gauges come from staged workers only: keep one of each kind
        assert obj["spec"]["minReplicaCount"] >= 1
        assert obj["spec"]["maxReplicaCount"] > obj["spec"]["minReplicaCount"]
    assert set(trigger_stages(scaled["splatq-worker-gpu"])) == {s.value for s in DEVICE_STAGES}


def test_the_stage_queries_read_real_gauges() -> None:
    """The queries name the stage gauges the staged workers export, and the ConfigMap's
    per-stage settings are valid for every stage they name."""
    registry = CollectorRegistry()
    EngineMetrics.create(registry)
    exposed = exposed_sample_names(registry)
    for obj in scaled_objects().values():
        for t in obj["spec"]["triggers"]:
            assert set(METRIC_NAME.findall(t["metadata"]["query"])) <= exposed
    settings = configured_settings()
    assert set(settings.stage_concurrency) <= {s.value for s in ALL_STAGES}
    assert settings.stage_buffer > 0


# -- custom resources against their CRD schemas ---------------------------------------------

CRD_MODELS: dict[str, type[BaseModel]] = {
    "ScaledObject": ScaledObject,
    "TriggerAuthentication": TriggerAuthentication,
    "PrometheusRule": PrometheusRule,
    "PodMonitor": PodMonitor,
}
CUSTOM_RESOURCE_FILES = [KEDA, KEDA_CLUSTER_EXAMPLE, RULES, PODMONITOR]


def schema_problems(model: type[BaseModel], doc: dict[str, Any]) -> list[str]:
    """What the CRD schema (its generated model) rejects in `doc`: validation errors, then
    every field the schema does not know or a value it had to coerce (the model ignores
    unknown fields, so a round trip that changes the document names them)."""
    try:
        parsed = model.model_validate(doc)
    except ValidationError as exc:
        return [f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()]
    back = parsed.model_dump(by_alias=True, exclude_unset=True, mode="json")
    return list(differences(doc, back, ""))


def differences(given: Any, kept: Any, path: str) -> Iterator[str]:
    if isinstance(given, dict) and isinstance(kept, dict):
        for key in given.keys() | kept.keys():
            if key not in kept:
                yield f"{path}.{key}: not in the schema"
            elif key not in given:
                yield f"{path}.{key}: added by the schema"
            else:
                yield from differences(given[key], kept[key], f"{path}.{key}")
    elif isinstance(given, list) and isinstance(kept, list) and len(given) == len(kept):
        for i, (g, k) in enumerate(zip(given, kept, strict=True)):
            yield from differences(g, k, f"{path}[{i}]")
    elif given != kept or type(given) is not type(kept):
        yield f"{path}: {given!r} read as {kept!r}"


@pytest.mark.parametrize("path", CUSTOM_RESOURCE_FILES, ids=lambda p: str(p.relative_to(K8S)))
def test_custom_resources_match_their_crd_schemas(path: Path) -> None:
    """Every KEDA and Prometheus Operator object validates against its CRD's schema, with no
    field the schema does not know and no value of the wrong type."""
    docs = load_docs(path)
    assert docs
    for doc in docs:
        model = CRD_MODELS[doc["kind"]]
        assert not schema_problems(model, doc), (doc["metadata"]["name"], model.__name__)


def test_the_schema_check_catches_mistakes() -> None:
    """The check above fails on an unknown field, a number given as a string, a missing
    required field and a wrong apiVersion."""
    good = scaled_objects()["splatq-worker-gpu"]
    assert not schema_problems(ScaledObject, good)
    typo = json.loads(json.dumps(good))
    typo["spec"]["minReplicaCounts"] = 1
    assert schema_problems(ScaledObject, typo) == [".spec.minReplicaCounts: not in the schema"]
    quoted = json.loads(json.dumps(good))
    quoted["spec"]["maxReplicaCount"] = "20"
    assert schema_problems(ScaledObject, quoted)
    missing = json.loads(json.dumps(good))
    del missing["spec"]["scaleTargetRef"]
    assert schema_problems(ScaledObject, missing)
    version = {**good, "apiVersion": "keda.sh/v1"}
    assert schema_problems(ScaledObject, version)
    rule = only_doc(RULES, "PrometheusRule")
    bad_rule = json.loads(json.dumps(rule))
    bad_rule["spec"]["groups"][0]["rules"][0]["for_"] = "5m"
    assert schema_problems(PrometheusRule, bad_rule)


# -- metrics in alerts and dashboard -----------------------------------------------------------


def test_sample_suffixes_match_prometheus_client() -> None:
    """The suffix table used below is what prometheus_client really exposes per type."""
    registry = CollectorRegistry()
    Counter("c_total", "c", registry=registry).inc()
    Gauge("g", "g", registry=registry).set(1)
    Histogram("h_seconds", "h", registry=registry).observe(1)
    Info("i", "i", registry=registry).info({"version": "1"})
    real = {s.name for family in registry.collect() for s in family.samples}
    assert exposed_sample_names(registry) == real


def test_alert_rules_reference_exposed_metrics() -> None:
    """Every splatq_* name in the alert expressions is a sample the engine, gateway, GPU
    worker or webhook dispatcher metrics expose."""
    exposed = exposed_metric_names()
    for rule in alert_rules():
        names = set(METRIC_NAME.findall(rule["expr"]))
        assert names or "up{" in rule["expr"], rule["alert"]
        assert names <= exposed, (rule["alert"], sorted(names - exposed))


def test_dashboard_targets_reference_exposed_metrics() -> None:
    """Every splatq_* name in the dashboard queries is a sample the engine, gateway, GPU
    worker or webhook dispatcher metrics expose."""
    exposed = exposed_metric_names()
    exprs = dashboard_exprs()
    assert exprs
    for expr in exprs:
        names = set(METRIC_NAME.findall(expr))
        external = set(EXTERNAL_METRIC.findall(expr))
        assert names or external, expr
        assert external <= EXTERNAL_METRICS, expr
        assert names <= exposed, (expr, sorted(names - exposed))


def test_every_metric_is_watched() -> None:
    """Each EngineMetrics, GatewayMetrics, GpuMetrics and DispatcherMetrics family appears on
    the dashboard or in an alert."""
    used = set(METRIC_NAME.findall(" ".join(all_exprs())))
    unwatched = [
        f.name
        for registry in metric_registries()
        for f in registry.collect()
        if not used & {f.name + suffix for suffix in SAMPLE_SUFFIXES[f.type]}
    ]
    assert not unwatched


# -- alert rules -------------------------------------------------------------------------------


def test_required_alerts_exist() -> None:
    """The PrometheusRule defines exactly the agreed set of alerts."""
    assert {r["alert"] for r in alert_rules()} == REQUIRED_ALERTS


def test_alerts_have_severity_annotations_and_runbooks() -> None:
    """Each alert has a severity, summary, description and a docs/operations.md runbook anchor
    that is a section of that document."""
    headings = set(
        re.findall(r"^#{2,4} +([a-z0-9-]+)\s*$", OPERATIONS_DOC.read_text(encoding="utf-8"), re.M)
    )
    assert headings >= RUNBOOK_ANCHORS, sorted(RUNBOOK_ANCHORS - headings)
    for rule in alert_rules():
        assert rule["labels"]["severity"] in {"critical", "warning"}, rule["alert"]
        annotations = rule["annotations"]
        assert annotations["summary"].strip(), rule["alert"]
        assert annotations["description"].strip(), rule["alert"]
        match = RUNBOOK.match(annotations["runbook_url"])
        assert match, rule["alert"]
        assert match.group(1) in RUNBOOK_ANCHORS, rule["alert"]


def test_rules_of_one_alert_are_told_apart() -> None:
    """Where one alert has several rules, their static labels differ (else their alerts
    would collide in Alertmanager)."""
    by_alert: dict[str, list[dict[str, str]]] = {}
    for rule in alert_rules():
        by_alert.setdefault(rule["alert"], []).append(rule["labels"])
    for alert, labels in by_alert.items():
        distinct = {tuple(sorted(label.items())) for label in labels}
        assert len(distinct) == len(labels), alert


def test_lost_entries_alert_is_critical_on_both_signals() -> None:
    """Lost entries page on the reaper's counter and on the Redis-backed gauge."""
    rules = [r for r in alert_rules() if r["alert"] == "SplatqStreamEntriesLost"]
    assert all(r["labels"]["severity"] == "critical" for r in rules)
    exprs = " ".join(r["expr"] for r in rules)
    assert "splatq_stream_entries_lost_total" in exprs
    assert "splatq_lost_entries" in exprs


def test_gateway_alerts_use_the_agreed_thresholds() -> None:
    """5xx ratio over 5 min above 2 %; p99 of POST /v1/jobs above 250 ms; OOM on both the
    failed-job code the GPU worker really uses and on batch splits."""
    rules = {r["alert"]: r for r in alert_rules()}
    errors = " ".join(rules["SplatqGatewayErrors"]["expr"].split())
    assert 'status=~"5.."' in errors
    assert "[5m]" in errors
    assert errors.endswith("> 0.02")
    slow = " ".join(rules["SplatqGatewaySlow"]["expr"].split())
    assert slow.startswith("histogram_quantile(0.99,")
    assert "splatq_http_request_duration_seconds_bucket" in slow
    assert 'route="/v1/jobs"' in slow
    assert slow.endswith("> 0.25")
    assert ("POST", "/v1/jobs") in gateway_routes()
    oom = " ".join(r["expr"] for r in alert_rules() if r["alert"] == "SplatqGpuOutOfMemory")
    assert f'splatq_gpu_job_errors_total{{code="{CUDA_OUT_OF_MEMORY}"}}' in oom
    assert "splatq_gpu_oom_splits_total" in oom


def test_webhook_alerts_use_the_agreed_thresholds() -> None:
    """Dead letters: any growth of the webhook dead-letter stream; backlog: pending messages
    high for 15 min; failures: more than 50 % of attempts not delivered over 15 min; late
    deliveries: due lag above 60 s for 10 min; any endpoint disabled in 15 min, its first
    disable included; circuits open for 30 min. Each points at its runbook section."""
    rules = {r["alert"]: r for r in alert_rules() if r["alert"].startswith("SplatqWebhook")}
    dead = " ".join(rules["SplatqWebhookDeadLetters"]["expr"].split())
    assert "splatq_webhook_dead_letter_length" in dead
    assert "[15m]" in dead
    assert dead.endswith("> 0")
    backlog = rules["SplatqWebhookBacklog"]
    assert "splatq_webhook_messages_pending" in backlog["expr"]
    assert backlog["for"] == "15m"
    failures = " ".join(rules["SplatqWebhookFailures"]["expr"].split())
    assert 'outcome!="delivered"' in failures
    assert failures.count("splatq_webhook_attempts_total") == 2
    assert failures.count("[15m]") == 2
    assert failures.endswith("> 0.5")
    late = rules["SplatqWebhookDeliveriesLate"]
    assert "splatq_webhook_due_lag_seconds" in late["expr"]
    assert late["expr"].startswith("max by (namespace, partition) (")
    assert late["expr"].endswith("> 60")
    assert late["for"] == "10m"
    disabled = " ".join(rules["SplatqWebhookEndpointDisabled"]["expr"].split())
    selector = 'splatq_webhook_circuit_transitions_total{job="splatq-dispatcher", to="disabled"}'
    assert disabled.count(selector) == 3
    assert f"increase({selector}[15m])" in disabled
    assert f"unless {selector} offset 15m" in disabled  # the first disable of a dispatcher
    assert disabled.endswith("> 0")
    assert "for" not in rules["SplatqWebhookEndpointDisabled"]
    circuits = rules["SplatqWebhookCircuitsOpen"]
    assert circuits["expr"].startswith("max by (namespace) (splatq_webhook_open_circuits{")
    assert circuits["for"] == "30m"
    runbooks = {
        "SplatqWebhookDeadLetters": "webhooks",
        "SplatqWebhookBacklog": "webhooks",
        "SplatqWebhookFailures": "webhooks",
        "SplatqWebhookDeliveriesLate": "webhook-deliveries-late",
        "SplatqWebhookEndpointDisabled": "webhook-endpoint-disabled",
        "SplatqWebhookCircuitsOpen": "webhook-circuits-open",
    }
    assert set(rules) == set(runbooks)
    for alert, anchor in runbooks.items():
        assert rules[alert]["annotations"]["runbook_url"] == f"docs/operations.md#{anchor}"


def test_redis_and_stream_alerts_use_the_agreed_thresholds() -> None:
    """Redis error replies: critical while workers keep getting 'not now' replies (OOM,
    READONLY, LOADING ...) for 5 min, warning on any script error reply in 15 min; refused
    event streams: above 0.1/s for 15 min. Each points at its runbook section."""
    rules = [r for r in alert_rules() if r["alert"] == "SplatqRedisErrorReplies"]
    by_severity = {r["labels"]["severity"]: r for r in rules}
    assert set(by_severity) == {"critical", "warning"}
    refusing = " ".join(by_severity["critical"]["expr"].split())
    assert 'splatq_redis_error_replies_total{kind!="other"}' in refusing
    assert refusing.startswith("sum by (namespace, kind) (rate(")
    assert refusing.endswith("> 0")
    assert by_severity["critical"]["for"] == "5m"
    script = " ".join(by_severity["warning"]["expr"].split())
    assert 'increase(splatq_redis_error_replies_total{kind="other"}[15m])' in script
    assert script.endswith("> 0")
    assert "for" not in by_severity["warning"]
    (sse,) = [r for r in alert_rules() if r["alert"] == "SplatqSseStreamsRefused"]
    assert "rate(splatq_sse_streams_refused_total{" in sse["expr"]
    assert sse["expr"].endswith("> 0.1")
    assert sse["for"] == "15m"
    for rule in [*rules, sse]:
        anchor = rule["annotations"]["runbook_url"].partition("#")[2]
        assert anchor == {"SplatqRedisErrorReplies": "redis-error-replies"}.get(
            rule["alert"], "sse-streams-refused"
        )


def test_stage_alerts_use_the_agreed_thresholds() -> None:
    """A stage whose oldest waiting job is over 5 min old for 10 min, per stage and stream;
    a stage more than 10 % of whose runs fail the job over 10 min, per stage. Each points
    at its runbook section; both read the gauges per stage as every staged worker reports
    them (max), the counter summed over the pods."""
    rules = {r["alert"]: r for r in alert_rules() if r["alert"].startswith("SplatqStage")}
    waiting = rules["SplatqStageWaitingTooLong"]
    assert waiting["expr"] == (
        "max by (namespace, stage, stream) (splatq_stage_oldest_waiting_age_seconds) > 300"
    )
    assert waiting["for"] == "10m"
    failing = " ".join(rules["SplatqStageRunsFailing"]["expr"].split())
    assert 'sum by (namespace, stage) (rate(splatq_stage_runs_total{outcome="failed"}[10m]))' in (
        failing
    )
    assert "/ sum by (namespace, stage) (rate(splatq_stage_runs_total[10m]))" in failing
    assert failing.endswith("> 0.1")
    assert rules["SplatqStageRunsFailing"]["for"] == "10m"
    assert waiting["annotations"]["runbook_url"] == "docs/operations.md#stage-waiting"
    assert (
        rules["SplatqStageRunsFailing"]["annotations"]["runbook_url"]
        == "docs/operations.md#stage-failures"
    )
    # "failed" is an outcome the worker really counts
    help_text = next(
        f.documentation for f in metric_registries()[0].collect() if f.name == "splatq_stage_runs"
    )
    assert "failed" in help_text


@pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed")
def test_promtool_accepts_the_rules(tmp_path: Path) -> None:
    """promtool parses every alert expression and annotation template."""
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule_groups_for_promtool()))
    run_promtool("check", "rules", "rules.yaml", cwd=tmp_path)


@pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed")
def test_promtool_alert_unit_tests(tmp_path: Path) -> None:
    """The gateway, GPU, webhook and Redis error-reply alerts fire, and stay quiet, as
    tests/k8s/alerts.promtool.yaml expects (evaluated by Prometheus' own engine)."""
    rules = rule_groups_for_promtool(annotations=False)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules))
    shutil.copy(PROMTOOL_TESTS, tmp_path / "tests.yaml")
    tested = set(re.findall(r"alertname: (\w+)", PROMTOOL_TESTS.read_text(encoding="utf-8")))
    assert tested >= {"SplatqGatewayErrors", "SplatqGatewaySlow", "SplatqGpuOutOfMemory"}
    assert tested >= {"SplatqRedisErrorReplies", "SplatqSseStreamsRefused"}
    assert tested >= {a for a in REQUIRED_ALERTS if a.startswith("SplatqWebhook")}
    assert "SplatqTaskNotSucceeding" in tested  # the dead man's switch of scheduled tasks
    assert {"SplatqStageWaitingTooLong", "SplatqStageRunsFailing", "SplatqWorkersDown"} <= tested
    run_promtool("test", "rules", "tests.yaml", cwd=tmp_path)


# -- dashboard ---------------------------------------------------------------------------------


def test_dashboard_uses_the_datasource_variable() -> None:
    """The dashboard parses, and every panel, query and variable uses ${DS_PROMETHEUS}."""
    board = dashboard()
    assert board["schemaVersion"] >= 36
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    for panel in dashboard_panels():
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == DS_VARIABLE, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == DS_VARIABLE, panel["title"]
    for var in variables.values():
        if var["type"] == "query":
            assert var["datasource"]["uid"] == DS_VARIABLE, var["name"]


def test_dashboard_has_filters_and_required_panels() -> None:
    """Stream/partition filters exist, panel ids are unique, and each required view is there."""
    board = dashboard()
    variables = {v["name"] for v in board["templating"]["list"]}
    assert {"stream", "partition"} <= variables
    panels = list(dashboard_panels())
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    exprs = " ".join(dashboard_exprs())
    for metric in (
        "splatq_queue_depth",
        "splatq_consumer_group_lag",
        "splatq_oldest_pending_age_seconds",
        "splatq_jobs_total",
        "splatq_retries_total",
        "splatq_dead_letters_total",
        "splatq_reclaims_total",
        "splatq_lease_renewal_failures_total",
        "splatq_http_requests_total",
        "splatq_submissions_total",
        "splatq_gpu_oom_splits_total",
        "splatq_webhook_attempts_total",
        "splatq_webhook_messages_pending",
        "splatq_webhook_dead_letter_length",
        "splatq_webhook_due_lag_seconds",
        "splatq_webhook_open_circuits",
        "splatq_webhook_circuit_transitions_total",
        "splatq_webhook_deferred_total",
        "splatq_redis_error_replies_total",
        "splatq_sse_streams_refused_total",
        "splatq_job_queue_wait_duration_seconds_bucket",
        "splatq_job_end_to_end_duration_seconds_bucket",
        "splatq_oldest_waiting_age_seconds",
        "splatq_jobs_in_state",
        "splatq_build_info",
        "DCGM_FI_DEV_GPU_UTIL",
        "splatq_stage_depth",
        "splatq_stage_running",
        "splatq_stage_oldest_waiting_age_seconds",
        "splatq_stage_runs_total",
        "splatq_stage_duration_seconds_bucket",
    ):
        assert metric in exprs, metric
    for q in ("0.5", "0.95", "0.99"):
        assert f"histogram_quantile({q}, " in exprs
    slots = [
        p
        for p in panels
        if {"splatq_slots_in_use", "splatq_slots_reserved"}
        <= {n for t in p.get("targets", []) for n in METRIC_NAME.findall(t["expr"])}
    ]
    assert slots, "no panel compares slots in use with reserved"
    memory = [
        p
        for p in panels
        if {"splatq_gpu_device_memory_bytes", "splatq_gpu_device_memory_peak_bytes"}
        <= {n for t in p.get("targets", []) for n in METRIC_NAME.findall(t["expr"])}
    ]
    assert memory, "no panel shows GPU memory in use against its peak"


def test_dashboard_links_to_the_runbooks() -> None:
    """The dashboard's links open runbook sections of docs/operations.md that exist."""
    board = dashboard()
    headings = set(
        re.findall(r"^#{2,4} +([a-z0-9-]+)\s*$", OPERATIONS_DOC.read_text(encoding="utf-8"), re.M)
    )
    base = next(v for v in board["templating"]["list"] if v["name"] == "runbooks")
    assert base["query"].endswith("docs/operations.md")
    anchors = set()
    for link in board["links"]:
        prefix, _, anchor = link["url"].partition("#")
        assert prefix == "${runbooks}", link
        anchors.add(anchor)
    assert anchors <= headings, sorted(anchors - headings)
    assert {"stuck-jobs", "gpu-utilisation", "liveness"} <= anchors
    for panel in dashboard_panels():
        for link in panel.get("links", []):
            prefix, _, anchor = link["url"].partition("#")
            assert prefix == "${runbooks}", (panel["title"], link)
            assert anchor in headings, (panel["title"], anchor)


@pytest.mark.parametrize(
    ("quantile", "histogram", "by"),
    [
        ("0.5", "splatq_job_queue_wait_duration_seconds", "stream, quality"),
        ("0.99", "splatq_job_queue_wait_duration_seconds", "stream, quality"),
        ("0.5", "splatq_job_end_to_end_duration_seconds", "stream, quality"),
        ("0.99", "splatq_job_end_to_end_duration_seconds", "stream, quality"),
        ("0.5", "splatq_http_request_duration_seconds", "route"),
        ("0.99", "splatq_http_request_duration_seconds", "route"),
        ("0.5", "splatq_gpu_batch_size", "quality"),
        ("0.99", "splatq_gpu_inference_duration_seconds", "quality"),
        ("0.5", "splatq_gpu_gaussians_per_job", "quality"),
        ("0.5", "splatq_webhook_attempt_duration_seconds", ""),
        ("0.99", "splatq_webhook_attempt_duration_seconds", ""),
        ("0.95", "splatq_stage_duration_seconds", "stage"),
    ],
)
def test_dashboard_plots_the_agreed_quantiles(quantile: str, histogram: str, by: str) -> None:
    """Gateway latency p50/p99 by route, GPU batch size p50, inference p99 and Gaussians per
    job by quality, webhook attempt latency p50/p99: each is one histogram_quantile aggregated
    `by (le, <label>)`, or `by (le)` where the histogram has no labels."""
    group = f"le, {by}" if by else "le"
    pattern = re.compile(
        rf"histogram_quantile\({re.escape(quantile)}, sum by \({group}\) "
        rf"\(rate\({histogram}_bucket\{{"
    )
    assert any(pattern.match(e) for e in dashboard_exprs()), (quantile, histogram, by)


def test_dashboard_has_a_pipeline_stages_row() -> None:
    """A "Pipeline stages" row holds, per stage, the depth (with running), the oldest
    waiting age, the run rate by outcome and the p95 duration."""
    panels = dashboard()["panels"]
    (row,) = [p for p in panels if p["type"] == "row" and p["title"] == "Pipeline stages"]
    start = panels.index(row) + 1
    end = next((i for i, p in enumerate(panels) if i >= start and p["type"] == "row"), len(panels))
    exprs = [t["expr"] for p in panels[start:end] for t in p["targets"]]
    wanted = [
        r"sum by \(stage\) \(max by \(stage, stream, partition\) \(splatq_stage_depth\{",
        r"sum by \(stage\) \(max by \(stage, stream, partition\) \(splatq_stage_running\{",
        r"max by \(stage, stream\) \(splatq_stage_oldest_waiting_age_seconds\{",
        r"sum by \(stage, outcome\) \(rate\(splatq_stage_runs_total\{",
        r"histogram_quantile\(0\.95, sum by \(le, stage\) "
        r"\(rate\(splatq_stage_duration_seconds_bucket\{",
    ]
    for pattern in wanted:
        assert any(re.match(pattern, e) for e in exprs), pattern
    # laid out on the grid below the row, not on top of the next one
    rows_y = sorted(p["gridPos"]["y"] for p in panels if p["type"] == "row")
    next_row = next((y for y in rows_y if y > row["gridPos"]["y"]), None)
    for p in panels[start:end]:
        bottom = p["gridPos"]["y"] + p["gridPos"]["h"]
        assert p["gridPos"]["y"] > row["gridPos"]["y"]
        assert next_row is None or bottom <= next_row, p["title"]


def test_dashboard_shows_requests_by_status_class() -> None:
    """A gateway panel groups the request rate by status class (2xx, 4xx, 5xx)."""
    exprs = [e for e in dashboard_exprs() if "splatq_http_requests_total" in e]
    assert any(
        "label_replace(" in e and '"status"' in e and "sum by (class)" in e for e in exprs
    ), exprs


@pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed")
def test_promtool_accepts_the_dashboard_queries(tmp_path: Path) -> None:
    """Every dashboard query, with Grafana's variables filled in, parses as PromQL."""
    rules = []
    for panel in dashboard_panels():
        for target in panel.get("targets", []):
            expr = target["expr"]
            for variable, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(variable, value)
            assert "$" not in expr.replace("${1}", ""), expr  # every variable is known
            rules.append(
                {"record": f"dashboard:panel_{panel['id']}_{target['refId']}", "expr": expr}
            )
    assert rules
    (tmp_path / "dashboard.yaml").write_text(
        yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]})
    )
    run_promtool("check", "rules", "dashboard.yaml", cwd=tmp_path)


def test_dashboard_shows_every_refusal_by_status() -> None:
    """A gateway panel shows 429 and 503 answers by route and status, so refusals the
    submissions counter has no outcome for (too_many_decodes, unavailable) and refused event
    streams are seen too; its description names each such code."""
    panels = [
        p
        for p in dashboard_panels()
        for t in p.get("targets", [])
        if "splatq_http_requests_total" in t["expr"]
        and 'status=~"429|503"' in t["expr"]
        and "sum by (route, status)" in t["expr"]
    ]
    assert len(panels) == 1
    for code in ("tenant_backlog_full", "too_many_streams", "too_many_decodes", "unavailable"):
        assert code in panels[0]["description"], code


def test_dashboard_lost_entries_stat_turns_red() -> None:
    """The lost-entries alarm is a stat panel whose threshold turns red at the first loss."""
    stats = [
        p
        for p in dashboard_panels()
        if p["type"] == "stat" and any("lost" in t["expr"] for t in p["targets"])
    ]
    assert len(stats) == 1
    steps = stats[0]["fieldConfig"]["defaults"]["thresholds"]["steps"]
    red = [s for s in steps if s["color"] == "red"]
    assert red
    assert 0 < red[0]["value"] <= 1
