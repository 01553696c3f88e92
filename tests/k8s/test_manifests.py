"""The k8s/ manifests, alert rules and dashboard agree with the code: they parse, name only
real settings and metrics, and keep the worker's shutdown and wiring consistent.

Pure file checks: no cluster, kubectl or network.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

import shared.settings
from shared.keys import STREAMS, KeySchema
from shared.metrics import EngineMetrics
from shared.settings import Settings

REPO_ROOT = Path(__file__).resolve().parents[2]
K8S = REPO_ROOT / "k8s"
BASE = K8S / "base"
CONFIGMAP = BASE / "configmap.yaml"
SECRET_EXAMPLE = BASE / "secret.example.yaml"
WORKER = BASE / "worker-deployment.yaml"
PODMONITOR = BASE / "podmonitor.yaml"
GPU_PATCH = K8S / "overlays" / "gpu" / "worker-gpu-patch.yaml"
KEDA = K8S / "autoscaling" / "keda-scaledobject.yaml"
RULES = K8S / "monitoring" / "prometheusrule.yaml"
DASHBOARD = K8S / "monitoring" / "grafana-dashboard.json"

YAML_FILES = sorted(p for p in K8S.rglob("*") if p.suffix in {".yaml", ".yml"})
DS_VARIABLE = "${DS_PROMETHEUS}"
METRIC_NAME = re.compile(r"\bsplatq_[a-z0-9_]+")
RUNBOOK = re.compile(r"^docs/operations\.md#([a-z0-9-]+)$")
RUNBOOK_ANCHORS = {
    "lost-entries",
    "dead-letters",
    "stuck-jobs",
    "lease-renewal-failures",
    "backlog",
    "retry-storm",
    "workers-down",
}
REQUIRED_ALERTS = {
    "SplatqStreamEntriesLost",
    "SplatqDeadLettersGrowing",
    "SplatqOldestPendingTooOld",
    "SplatqLeaseRenewalFailures",
    "SplatqQueueBacklogHigh",
    "SplatqRetryStorm",
    "SplatqWorkersDown",
}
# Sample names prometheus_client exposes per metric type (the family name drops `_total`).
SAMPLE_SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
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


def worker_container() -> dict[str, Any]:
    spec = only_doc(WORKER, "Deployment")["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in spec["containers"]}
    container: dict[str, Any] = containers["worker"]
    return container


def env_names_read_by_settings() -> set[str]:
    """Every `"SPLATQ_..."` literal in shared/settings.py: the variables `from_env` reads."""
    source = Path(shared.settings.__file__).read_text(encoding="utf-8")
    names = set(re.findall(r'"(SPLATQ_[A-Z0-9_]+)"', source))
    assert "SPLATQ_REDIS_URL" in names  # the scan itself works
    return names


def exposed_sample_names(registry: CollectorRegistry) -> set[str]:
    names: set[str] = set()
    for family in registry.collect():
        names.update(family.name + suffix for suffix in SAMPLE_SUFFIXES[family.type])
        names.update(sample.name for sample in family.samples)
    return names


def engine_metric_names() -> set[str]:
    registry = CollectorRegistry()
    EngineMetrics.create(registry)
    return exposed_sample_names(registry)


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
        WORKER,
        PODMONITOR,
        K8S / "overlays" / "gpu" / "kustomization.yaml",
        GPU_PATCH,
        KEDA,
        K8S / "monitoring" / "kustomization.yaml",
        RULES,
        DASHBOARD,
        K8S / "README.md",
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


def test_base_applies_every_manifest_but_the_secret_example() -> None:
    """The base lists each of its manifests except the example Secret, which it must not apply."""
    resources = set(only_doc(BASE / "kustomization.yaml", "Kustomization")["resources"])
    assert SECRET_EXAMPLE.name not in resources
    manifests = {p.name for p in BASE.glob("*.yaml")} - {"kustomization.yaml", SECRET_EXAMPLE.name}
    assert manifests == resources


# -- settings ----------------------------------------------------------------------------------


def test_configmap_keys_are_real_settings() -> None:
    """Every SPLATQ_* key in the ConfigMap is a variable Settings.from_env reads."""
    known = env_names_read_by_settings()
    keys = set(configmap_data())
    assert keys, "empty ConfigMap"
    assert all(k.startswith("SPLATQ_") for k in keys), keys
    assert keys <= known, sorted(keys - known)


def test_secret_example_keys_are_real_settings() -> None:
    """The example Secret carries the Redis URL and API keys, and its SPLATQ_* keys are real."""
    known = env_names_read_by_settings()
    keys = {k for k in secret_example_data() if k.startswith("SPLATQ_")}
    assert {"SPLATQ_REDIS_URL", "SPLATQ_API_KEYS"} <= keys
    assert keys <= known, sorted(keys - known)


def test_secrets_stay_out_of_the_configmap() -> None:
    """Credentials are only in the Secret, never in the ConfigMap."""
    assert not {"SPLATQ_REDIS_URL", "SPLATQ_API_KEYS"} & set(configmap_data())


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
    combined = Settings.from_env({**data, **secret_example_data()})
    assert not combined.redis_url_is_default
    assert combined.api_keys


def test_settings_accept_the_gpu_overlay() -> None:
    """The GPU overlay's env on top of the ConfigMap is valid and selects CUDA."""
    patch = only_doc(GPU_PATCH, "Deployment")
    container = next(c for c in patch["spec"]["template"]["spec"]["containers"])
    env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    assert all(k in env_names_read_by_settings() for k in env if k.startswith("SPLATQ_"))
    assert Settings.from_env({**configmap_data(), **env}).device == "cuda"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1


# -- worker Deployment -------------------------------------------------------------------------


def test_termination_grace_exceeds_shutdown_grace() -> None:
    """The kubelet waits at least 10 s longer than the worker's SIGTERM drain."""
    grace = Settings.from_env(configmap_data()).shutdown_grace_s
    pod = only_doc(WORKER, "Deployment")["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] >= grace + 10


def test_worker_container_is_wired_to_config_and_metrics() -> None:
    """The worker runs `splatq worker` on the ConfigMap and Secret and probes its metrics port."""
    container = worker_container()
    assert container["command"][-1] == "worker"
    refs = [
        (e.get("configMapRef") or e.get("secretRef") or {}).get("name")
        for e in container["envFrom"]
    ]
    cm_name = only_doc(CONFIGMAP, "ConfigMap")["metadata"]["name"]
    secret_name = only_doc(SECRET_EXAMPLE, "Secret")["metadata"]["name"]
    assert refs == [cm_name, secret_name]  # the Secret last, so it wins
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["metrics"] == int(configmap_data()["SPLATQ_METRICS_PORT"])
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["port"] == "metrics", probe
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


def test_pdb_and_podmonitor_select_the_worker_pods() -> None:
    """The PDB and PodMonitor select worker pods, and the PodMonitor's job matches the alerts."""
    pod_template = only_doc(WORKER, "Deployment")["spec"]["template"]
    labels = pod_template["metadata"]["labels"]
    pdb = only_doc(WORKER, "PodDisruptionBudget")
    assert label_subset(pdb["spec"]["selector"]["matchLabels"], labels)
    monitor = only_doc(PODMONITOR, "PodMonitor")["spec"]
    assert label_subset(monitor["selector"]["matchLabels"], labels)
    port_names = {p["name"] for c in pod_template["spec"]["containers"] for p in c["ports"]}
    assert {e["port"] for e in monitor["podMetricsEndpoints"]} <= port_names
    jobs = {j for r in alert_rules() for j in re.findall(r'job="([^"]+)"', r["expr"])}
    assert jobs == {labels[monitor["jobLabel"]]}


# -- KEDA --------------------------------------------------------------------------------------


def test_keda_triggers_watch_the_real_streams() -> None:
    """KEDA's redis-streams triggers name partition 0's streams and the configured group."""
    docs = load_docs(KEDA)
    scaled = next(d for d in docs if d["kind"] == "ScaledObject")
    auth = next(d for d in docs if d["kind"] == "TriggerAuthentication")
    assert (
        scaled["spec"]["scaleTargetRef"]["name"]
        == only_doc(WORKER, "Deployment")["metadata"]["name"]
    )
    keys = KeySchema()
    streams = {keys.stream(0, s) for s in STREAMS}
    group = configmap_data()["SPLATQ_CONSUMER_GROUP"]
    triggers = scaled["spec"]["triggers"]
    lag_triggers = [t for t in triggers if "lagCount" in t["metadata"]]
    assert {t["metadata"]["stream"] for t in lag_triggers} == streams
    for t in triggers:
        meta = t["metadata"]
        assert t["type"] == "redis-streams"
        assert all(isinstance(v, str) for v in meta.values()), meta  # KEDA wants strings
        assert meta["stream"] in streams
        assert t["authenticationRef"]["name"] == auth["metadata"]["name"]
    for t in lag_triggers:
        meta = t["metadata"]
        assert meta["consumerGroup"] == group
        assert int(meta["lagCount"]) > 0
        assert int(meta["activationLagCount"]) >= 0
    secret_keys = set(secret_example_data())
    secret_name = only_doc(SECRET_EXAMPLE, "Secret")["metadata"]["name"]
    for ref in auth["spec"]["secretTargetRef"]:
        assert ref["name"] == secret_name
        assert ref["key"] in secret_keys


# -- metrics in alerts and dashboard -----------------------------------------------------------


def test_sample_suffixes_match_prometheus_client() -> None:
    """The suffix table used below is what prometheus_client really exposes per type."""
    registry = CollectorRegistry()
    Counter("c_total", "c", registry=registry).inc()
    Gauge("g", "g", registry=registry).set(1)
    Histogram("h_seconds", "h", registry=registry).observe(1)
    real = {s.name for family in registry.collect() for s in family.samples}
    assert exposed_sample_names(registry) == real


def test_alert_rules_reference_exposed_metrics() -> None:
    """Every splatq_* name in the alert expressions is a sample EngineMetrics exposes."""
    exposed = engine_metric_names()
    for rule in alert_rules():
        names = set(METRIC_NAME.findall(rule["expr"]))
        assert names or "up{" in rule["expr"], rule["alert"]
        assert names <= exposed, (rule["alert"], sorted(names - exposed))


def test_dashboard_targets_reference_exposed_metrics() -> None:
    """Every splatq_* name in the dashboard queries is a sample EngineMetrics exposes."""
    exposed = engine_metric_names()
    exprs = dashboard_exprs()
    assert exprs
    for expr in exprs:
        names = set(METRIC_NAME.findall(expr))
        assert names, expr
        assert names <= exposed, (expr, sorted(names - exposed))


def test_every_engine_metric_is_watched() -> None:
    """Each EngineMetrics family appears on the dashboard or in an alert."""
    registry = CollectorRegistry()
    EngineMetrics.create(registry)
    used = set(
        METRIC_NAME.findall(" ".join(dashboard_exprs() + [r["expr"] for r in alert_rules()]))
    )
    unwatched = [
        f.name
        for f in registry.collect()
        if not used & {f.name + suffix for suffix in SAMPLE_SUFFIXES[f.type]}
    ]
    assert not unwatched


# -- alert rules -------------------------------------------------------------------------------


def test_required_alerts_exist() -> None:
    """The PrometheusRule defines exactly the agreed set of alerts."""
    assert {r["alert"] for r in alert_rules()} == REQUIRED_ALERTS


def test_alerts_have_severity_annotations_and_runbooks() -> None:
    """Each alert has a severity, summary, description and a docs/operations.md runbook anchor."""
    for rule in alert_rules():
        assert rule["labels"]["severity"] in {"critical", "warning"}, rule["alert"]
        annotations = rule["annotations"]
        assert annotations["summary"].strip(), rule["alert"]
        assert annotations["description"].strip(), rule["alert"]
        match = RUNBOOK.match(annotations["runbook_url"])
        assert match, rule["alert"]
        assert match.group(1) in RUNBOOK_ANCHORS, rule["alert"]


def test_lost_entries_alert_is_critical_on_both_signals() -> None:
    """Lost entries page on the reaper's counter and on the Redis-backed gauge."""
    rules = [r for r in alert_rules() if r["alert"] == "SplatqStreamEntriesLost"]
    assert all(r["labels"]["severity"] == "critical" for r in rules)
    exprs = " ".join(r["expr"] for r in rules)
    assert "splatq_stream_entries_lost_total" in exprs
    assert "splatq_lost_entries" in exprs


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
