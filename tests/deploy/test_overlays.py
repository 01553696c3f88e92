"""Every overlay a user applies (k8s/base, overlays/dev, overlays/gpu), built with kustomize and
checked object by object: core objects against the Kubernetes OpenAPI schemas (strict: an
unknown field fails), KEDA and Prometheus Operator objects against their CRD models; every pod
against the restricted Pod Security Standard; every splatq container runs a command the CLI
accepts, with only real settings in its environment, from the project's image; and what each
overlay promises (the settler, the dev stack's Redis and MinIO, the GPU overlay's scheduling).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from cloudcoil.models.keda.v1alpha1 import ScaledObject
from cloudcoil.models.prometheus_operator.v1 import PodMonitor

from splatq.shared.settings import Settings, SettingsError
from tests.deploy.manifests import (
    DEV_DEPENDENCY_IMAGES,
    OVERLAYS,
    PACKAGE_VERSION,
    PROJECT_IMAGE_TAGS,
    build,
    cli_problem,
    container_environment,
    image_name_and_tag,
    is_project_image,
    objects_of,
    pod_templates,
    restricted_violations,
    splatq_containers,
    splatq_invocations,
    unknown_variables,
)
from tests.deploy.schemas import core_schema_problems, crd_problems

# The oldest Kubernetes minor the manifests are validated against (topologySpreadConstraints'
# matchLabelKeys is beta, on by default, from 1.27); kubernetes-validate ships its schemas.
KUBERNETES_VERSION = "1.29"
CUSTOM_MODELS = {"ScaledObject": ScaledObject, "PodMonitor": PodMonitor}
SERVICES = ("gateway", "worker", "dispatcher", "redriver", "settler")


def core_problems(doc: dict[str, Any]) -> list[str]:
    return core_schema_problems(doc, KUBERNETES_VERSION)


# -- schemas -----------------------------------------------------------------------------------


@pytest.mark.parametrize("folder", OVERLAYS)
def test_every_object_matches_its_schema(folder: str) -> None:
    problems = []
    for doc in build(folder):
        model = CUSTOM_MODELS.get(doc["kind"])
        if model is not None:
            problems += crd_problems(model, doc)
        else:
            problems += core_problems(doc)
    assert problems == []


def test_the_schema_check_refuses_unknown_fields_and_wrong_types() -> None:
    [deployment] = [d for d in build("base") if d["kind"] == "Deployment"][:1]
    assert core_problems(deployment) == []
    typo = copy.deepcopy(deployment)
    typo["spec"]["template"]["spec"]["containers"][0]["imagePullPolcy"] = "Always"
    assert core_problems(typo)
    wrong = copy.deepcopy(deployment)
    wrong["spec"]["replicas"] = "two"
    assert core_problems(wrong)
    policy = copy.deepcopy(objects_of(build("base"), "NetworkPolicy")["splatq-default-deny"])
    policy["spec"]["podSelector"] = "all"
    assert core_problems(policy)


# -- Pod Security --------------------------------------------------------------------------------


@pytest.mark.parametrize("folder", OVERLAYS)
def test_the_namespace_enforces_the_restricted_profile(folder: str) -> None:
    [namespace] = objects_of(build(folder), "Namespace").values()
    labels = namespace["metadata"]["labels"]
    for mode in ("enforce", "audit", "warn"):
        assert labels[f"pod-security.kubernetes.io/{mode}"] == "restricted"
    assert {d["metadata"].get("namespace") for d in build(folder) if d["kind"] != "Namespace"} <= {
        namespace["metadata"]["name"],
        None,  # cluster-scoped: PriorityClass
    }


@pytest.mark.parametrize("folder", OVERLAYS)
def test_every_pod_meets_the_restricted_profile(folder: str) -> None:
    pods = pod_templates(build(folder))
    assert pods
    for pod in pods:
        assert restricted_violations(pod.spec) == [], pod.owner
        for c in pod.containers():
            assert c["securityContext"].get("readOnlyRootFilesystem") is True, (
                pod.owner,
                c["name"],
            )
        assert pod.spec.get("automountServiceAccountToken") is False, pod.owner


def test_the_profile_check_catches_each_kind_of_violation() -> None:
    [pod] = pod_templates(build("base"))[:1]
    breaks = [
        lambda s: s["securityContext"].pop("runAsNonRoot"),
        lambda s: s["securityContext"].pop("seccompProfile"),
        lambda s: s["containers"][0]["securityContext"].update(allowPrivilegeEscalation=True),
        lambda s: s["containers"][0]["securityContext"]["capabilities"].update(drop=["NET_RAW"]),
        lambda s: s["containers"][0]["securityContext"].update(privileged=True),
        lambda s: s.update(hostNetwork=True),
        lambda s: s["volumes"].append({"name": "h", "hostPath": {"path": "/"}}),
        lambda s: s["containers"][0]["ports"][0].update(hostPort=80),
    ]
    for breaking in breaks:
        spec = copy.deepcopy(dict(pod.spec))
        breaking(spec)
        assert restricted_violations(spec), breaking


# -- what the splatq containers run ----------------------------------------------------------------


@pytest.mark.parametrize("folder", OVERLAYS)
def test_every_command_and_flag_exists_in_the_cli(folder: str) -> None:
    ran = set()
    for owner, c in splatq_containers(build(folder)):
        assert "args" not in c, owner  # the whole command line is `command`
        for args in splatq_invocations(c["command"]):
            assert cli_problem(args) is None, (owner, args, cli_problem(args))
            ran.add(args[0])
        probe_commands = [
            (c.get(p) or {}).get("exec", {}).get("command")
            for p in ("startupProbe", "readinessProbe", "livenessProbe")
        ]
        for command in filter(None, probe_commands):
            for args in splatq_invocations(command):
                assert cli_problem(args) is None, (owner, args)
    assert set(SERVICES) <= ran


def test_the_cli_check_refuses_unknown_commands_flags_and_stages() -> None:
    assert cli_problem(["worker", "--stages", "all"]) is None
    assert cli_problem(["settler"]) is None
    assert cli_problem(["gateway", "--check"]) is None
    assert cli_problem(["worker", "--stage", "all"])
    assert cli_problem(["worker", "--stages", "ingest,polish"])
    assert cli_problem(["setler"])
    script = "splatq tenants show dev >/dev/null 2>&1 || splatq tenants create dev && splatq x"
    assert [a[0] for a in splatq_invocations(["sh", "-c", script])] == ["tenants", "tenants", "x"]
    with pytest.raises(AssertionError):
        splatq_invocations(["python", "-m", "splatq"])


@pytest.mark.parametrize("folder", OVERLAYS)
def test_every_environment_variable_is_a_real_setting(folder: str) -> None:
    docs = build(folder)
    for owner, c in splatq_containers(docs):
        env, _ = container_environment(docs, c)
        assert unknown_variables(set(env)) == set(), owner
        for ref in c.get("envFrom", []):
            assert set(ref) <= {"configMapRef", "secretRef"}, owner  # no prefix games


@pytest.mark.parametrize("folder", OVERLAYS)
def test_settings_accept_every_container_environment(folder: str) -> None:
    """What each splatq container starts with is a valid configuration (where the overlay
    holds its Secret, the whole of it)."""
    docs = build(folder)
    for owner, c in splatq_containers(docs):
        env, missing = container_environment(docs, c)
        if folder == "overlays/dev":
            assert missing == [], owner  # the dev stack brings everything
        try:
            Settings.from_env(env)
        except SettingsError as exc:
            pytest.fail(f"{owner}: {exc}")


def test_the_variable_check_catches_a_misspelt_setting() -> None:
    assert unknown_variables({"SPLATQ_REDIS_URL", "HOME"}) == set()
    assert unknown_variables({"SPLATQ_REDIS_ULR"}) == {"SPLATQ_REDIS_ULR"}


@pytest.mark.parametrize("folder", OVERLAYS)
def test_every_image_is_the_projects_or_a_pinned_dev_dependency(folder: str) -> None:
    for pod in pod_templates(build(folder)):
        for c in pod.containers():
            image = c["image"]
            if is_project_image(image):
                assert image_name_and_tag(image)[1] in PROJECT_IMAGE_TAGS, (pod.owner, image)
            else:
                assert folder == "overlays/dev", (pod.owner, image)
                assert image in DEV_DEPENDENCY_IMAGES, (pod.owner, image)
            assert c.get("imagePullPolicy") == "IfNotPresent", (pod.owner, image)


# -- the base: the settler ---------------------------------------------------------------------


def test_the_settler_runs_with_a_pdb_probes_and_metrics() -> None:
    docs = build("base")
    settler = objects_of(docs, "Deployment")["splatq-settler"]
    pod = settler["spec"]["template"]
    [container] = pod["spec"]["containers"]
    assert container["command"] == ["splatq", "settler"]
    assert settler["spec"]["replicas"] >= 2
    assert container["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"]["port"] == "metrics"
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {
        "metrics": int(
            objects_of(docs, "ConfigMap")["splatq-config"]["data"]["SPLATQ_METRICS_PORT"]
        )
    }
    pdb = objects_of(docs, "PodDisruptionBudget")["splatq-settler"]
    assert pdb["spec"]["selector"]["matchLabels"] == settler["spec"]["selector"]["matchLabels"]
    [monitor] = [
        m
        for m in objects_of(docs, "PodMonitor").values()
        if all(
            pod["metadata"]["labels"].get(k) == v
            for k, v in m["spec"]["selector"]["matchLabels"].items()
        )
    ]
    assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == ["metrics"]


@pytest.mark.parametrize("folder", OVERLAYS)
def test_every_deployment_has_a_pdb(folder: str) -> None:
    docs = build(folder)
    pdbs = [
        p["spec"]["selector"]["matchLabels"]
        for p in objects_of(docs, "PodDisruptionBudget").values()
    ]
    for name, d in objects_of(docs, "Deployment").items():
        if d["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/part-of") != "splatq":
            continue  # the dev stack's single Redis and MinIO
        assert d["spec"]["selector"]["matchLabels"] in pdbs, name


# -- the dev overlay ------------------------------------------------------------------------------


def test_dev_runs_the_whole_stack_in_one_namespace() -> None:
    docs = build("overlays/dev")
    deployments = objects_of(docs, "Deployment")
    commands = {
        name: d["spec"]["template"]["spec"]["containers"][0]["command"]
        for name, d in deployments.items()
    }
    for cls in ("interactive", "synthesis"):
        command = commands[f"splatq-worker-cpu-{cls}"]
        assert command == ["splatq", "worker", "--stages", "all", "--classes", cls]
    assert "splatq-worker-gpu" not in deployments
    for service in ("gateway", "dispatcher", "redriver", "settler"):
        assert commands[f"splatq-{service}"] == ["splatq", service]
    assert all(d["spec"]["replicas"] == 1 for d in deployments.values())
    assert not objects_of(docs, "PodMonitor")  # no Prometheus Operator needed
    jobs = objects_of(docs, "Job")
    assert set(jobs) == {"splatq-dev-key", "splatq-minio-bucket"}


def test_dev_redis_keeps_an_aof_on_a_volume_and_never_evicts() -> None:
    docs = build("overlays/dev")
    redis = objects_of(docs, "Deployment")["splatq-redis"]
    spec = redis["spec"]["template"]["spec"]
    command = spec["containers"][0]["command"]
    options = dict(zip(command[1::2], command[2::2], strict=True))
    assert options["--appendonly"] == "yes"
    assert options["--maxmemory-policy"] == "noeviction"
    [data] = [
        m for m in spec["containers"][0]["volumeMounts"] if m["mountPath"] == options["--dir"]
    ]
    [volume] = [v for v in spec["volumes"] if v["name"] == data["name"]]
    assert volume["persistentVolumeClaim"]["claimName"] in objects_of(docs, "PersistentVolumeClaim")
    assert redis["spec"]["strategy"]["type"] == "Recreate"
    secret = container_environment(docs, {"envFrom": [{"secretRef": {"name": "splatq-secrets"}}]})
    url = secret[0]["SPLATQ_REDIS_URL"]
    service = objects_of(docs, "Service")["splatq-redis"]
    assert url == f"redis://{service['metadata']['name']}:{service['spec']['ports'][0]['port']}/0"


def test_dev_storage_is_the_in_cluster_minio_bucket() -> None:
    docs = build("overlays/dev")
    config = objects_of(docs, "ConfigMap")["splatq-config"]["data"]
    job = objects_of(docs, "Job")["splatq-minio-bucket"]["spec"]["template"]["spec"]
    command = job["containers"][0]["command"]
    bucket = command[-1].partition("/")[2]
    assert config["SPLATQ_STORAGE_URL"].startswith(f"s3://{bucket}/")
    service = objects_of(docs, "Service")["splatq-minio"]
    port = service["spec"]["ports"][0]["port"]
    assert config["SPLATQ_S3_ENDPOINT_URL"] == f"http://{service['metadata']['name']}:{port}"
    env = {e["name"]: e.get("value", "") for e in job["containers"][0]["env"]}
    assert env["MC_HOST_dev"].endswith(f"@{service['metadata']['name']}:{port}")
    minio = objects_of(docs, "Deployment")["splatq-minio"]["spec"]["template"]["spec"]
    assert [v for v in minio["volumes"] if "persistentVolumeClaim" in v]


def test_dev_key_is_generated_in_the_cluster_not_committed() -> None:
    docs = build("overlays/dev")
    secret, _ = container_environment(
        docs, {"envFrom": [{"secretRef": {"name": "splatq-secrets"}}]}
    )
    assert "SPLATQ_API_KEYS" not in secret
    [container] = objects_of(docs, "Job")["splatq-dev-key"]["spec"]["template"]["spec"][
        "containers"
    ]
    invocations = splatq_invocations(container["command"])
    assert invocations[-1][:3] == ["keys", "add", "dev"]


@pytest.mark.parametrize("folder", OVERLAYS)
def test_only_the_dev_dispatcher_reaches_private_addresses(folder: str) -> None:
    docs = build(folder)
    for owner, c in splatq_containers(docs):
        env, _ = container_environment(docs, c)
        allow = env.get("SPLATQ_WEBHOOK_ALLOW_PRIVATE", "0")
        expected = (
            "1" if (folder, owner) == ("overlays/dev", "Deployment/splatq-dispatcher") else "0"
        )
        assert allow == expected, owner


# -- the gpu overlay ----------------------------------------------------------------------------


def test_gpu_overlay_schedules_by_priority_and_spreads_over_zones() -> None:
    docs = build("overlays/gpu")
    classes = objects_of(docs, "PriorityClass")
    deployments = objects_of(docs, "Deployment")
    priority = {
        name: classes[d["spec"]["template"]["spec"]["priorityClassName"]]["value"]
        for name, d in deployments.items()
    }
    serving = ("splatq-gateway", "splatq-worker-gpu", "splatq-worker-cpu-interactive")
    for name in (*serving, "splatq-dispatcher"):
        for background in ("splatq-redriver", "splatq-settler", "splatq-worker-cpu-synthesis"):
            assert priority[name] > priority[background], (name, background)
    for d in deployments.values():
        keys = {
            c["topologyKey"] for c in d["spec"]["template"]["spec"]["topologySpreadConstraints"]
        }
        assert keys == {"kubernetes.io/hostname", "topology.kubernetes.io/zone"}
        for c in d["spec"]["template"]["spec"]["containers"]:
            assert set(c["resources"]["requests"]) >= {"cpu", "memory"}


def test_gpu_overlay_runs_the_cuda_image_on_gpu_nodes_with_keda() -> None:
    docs = build("overlays/gpu")
    deployments = objects_of(docs, "Deployment")
    gpu = deployments["splatq-worker-gpu"]["spec"]["template"]["spec"]
    [worker] = gpu["containers"]
    assert worker["image"] == f"registry.example.com/splatq:{PACKAGE_VERSION}-cuda"
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert gpu["nodeSelector"]
    assert gpu["tolerations"]
    for name, d in deployments.items():
        if name != "splatq-worker-gpu":
            image = d["spec"]["template"]["spec"]["containers"][0]["image"]
            assert image == f"registry.example.com/splatq:{PACKAGE_VERSION}", name
    scaled = objects_of(docs, "ScaledObject")
    cpu_workers = {"splatq-worker-cpu-interactive", "splatq-worker-cpu-synthesis"}
    assert set(scaled) == {"splatq-worker-gpu", *cpu_workers}
    for name in scaled:
        assert "replicas" not in deployments[name]["spec"]  # the HPA owns it
