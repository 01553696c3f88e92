"""The NetworkPolicies of every overlay, evaluated (tests/deploy/netpol.py) on the pods the
overlay runs: each connection a service needs is admitted (DNS, Redis, object storage, the
gateway's API port, Prometheus scrapes, webhooks to the public internet), and the rest is
denied: the cloud metadata address from every pod on every port, private ranges from the
dispatcher, Redis from anything but splatq pods (dev), other namespaces' pods everywhere."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.deploy.manifests import OVERLAYS, build, objects_of, pod_templates
from tests.deploy.netpol import External, Pod, allowed

NAMESPACE = "splatq"
DNS = Pod("kube-system", {"k8s-app": "kube-dns"})
PROMETHEUS = Pod("monitoring", {"app.kubernetes.io/name": "prometheus"})
INGRESS_CONTROLLER = Pod("ingress-nginx", {"app.kubernetes.io/name": "ingress-nginx"})
STRANGER = Pod("default", {"app": "curious"})  # any pod of another namespace
NEIGHBOUR = Pod(NAMESPACE, {"app": "curious"})  # a pod of this namespace, not splatq's
RECEIVER = Pod("webhooks", {"app": "receiver"}, {"http": 8000})  # a cluster-local receiver
EXTERNAL_REDIS = (External("10.20.30.40"), Pod("redis", {"app.kubernetes.io/name": "redis"}))
S3 = External("52.216.8.1")
PUBLIC = External("93.184.215.14")
PUBLIC_V6 = External("2606:2800:21f:cb07:6820:80da:af6b:8b2c")
METADATA = (External("169.254.169.254"), External("fd00:ec2::254"))
PRIVATE = tuple(
    External(ip)
    for ip in ("10.0.0.7", "172.16.5.4", "192.168.1.10", "100.64.0.9", "127.0.0.1", "fd12::1")
)
STORAGE_USERS = frozenset({"gateway", "worker", "redriver"})


def policies(folder: str) -> list[dict[str, Any]]:
    return list(objects_of(build(folder), "NetworkPolicy").values())


def pods(folder: str) -> dict[str, Pod]:
    """The overlay's pods by app.kubernetes.io/name."""
    return {
        t.labels["app.kubernetes.io/name"]: Pod(t.namespace, dict(t.labels), t.named_ports())
        for t in pod_templates(build(folder))
    }


def splatq_pods(folder: str) -> dict[str, Pod]:
    return {
        n: p
        for n, p in pods(folder).items()
        if p.labels.get("app.kubernetes.io/part-of") == "splatq"
    }


def component(pod: Pod) -> str:
    return pod.labels.get("app.kubernetes.io/component", "")


@pytest.mark.parametrize("folder", OVERLAYS)
def test_the_namespace_denies_by_default(folder: str) -> None:
    deny = [
        p
        for p in policies(folder)
        if p["spec"]["podSelector"] == {}
        and set(p["spec"]["policyTypes"]) == {"Ingress", "Egress"}
        and not p["spec"].get("ingress")
        and not p["spec"].get("egress")
    ]
    assert deny, "no default-deny policy"
    for name, pod in pods(folder).items():
        open_ports = {8080} if name == "splatq-gateway" else set()  # the API, next test
        for port in {*pod.ports.values(), 22} - open_ports:
            assert not allowed(policies(folder), STRANGER, pod, port), (name, port)
        if not (folder == "overlays/dev" and name == "splatq-dispatcher"):  # dev receivers
            assert not allowed(policies(folder), pod, STRANGER, 8080), name


@pytest.mark.parametrize("folder", OVERLAYS)
def test_every_pod_resolves_names(folder: str) -> None:
    for name, pod in pods(folder).items():
        assert allowed(policies(folder), pod, DNS, 53, "UDP"), name
        assert allowed(policies(folder), pod, DNS, 53, "TCP"), name


@pytest.mark.parametrize("folder", OVERLAYS)
def test_every_splatq_pod_reaches_redis(folder: str) -> None:
    targets: tuple[Any, ...] = EXTERNAL_REDIS
    if folder == "overlays/dev":
        targets = (pods(folder)["splatq-redis"],)
    for name, pod in splatq_pods(folder).items():
        for redis in targets:
            assert allowed(policies(folder), pod, redis, 6379), (name, redis)


@pytest.mark.parametrize("folder", OVERLAYS)
def test_storage_users_reach_object_storage(folder: str) -> None:
    storage, port = (S3, 443)
    if folder == "overlays/dev":
        storage, port = pods(folder)["splatq-minio"], 9000
    users = {n: p for n, p in splatq_pods(folder).items() if component(p) in STORAGE_USERS}
    assert {component(p) for p in users.values()} == STORAGE_USERS
    for name, pod in users.items():
        assert allowed(policies(folder), pod, storage, port), name


@pytest.mark.parametrize("folder", OVERLAYS)
def test_the_gateway_takes_api_traffic_from_anywhere(folder: str) -> None:
    gateway = pods(folder)["splatq-gateway"]
    for client in (INGRESS_CONTROLLER, STRANGER, PUBLIC):
        assert allowed(policies(folder), client, gateway, gateway.ports["http"])
        assert not allowed(policies(folder), client, gateway, 9100)


@pytest.mark.parametrize("folder", OVERLAYS)
def test_prometheus_scrapes_every_metrics_port(folder: str) -> None:
    scraped = {n: p for n, p in splatq_pods(folder).items() if "metrics" in p.ports}
    assert len(scraped) >= 4
    for name, pod in scraped.items():
        assert allowed(policies(folder), PROMETHEUS, pod, pod.ports["metrics"]), name
        assert not allowed(policies(folder), STRANGER, pod, pod.ports["metrics"]), name


@pytest.mark.parametrize("folder", OVERLAYS)
def test_the_dispatcher_reaches_only_the_public_internet_on_443(folder: str) -> None:
    dispatcher = pods(folder)["splatq-dispatcher"]
    rules = policies(folder)
    assert allowed(rules, dispatcher, PUBLIC, 443)
    assert allowed(rules, dispatcher, PUBLIC_V6, 443)
    assert not allowed(rules, dispatcher, PUBLIC, 80)
    assert not allowed(rules, dispatcher, PUBLIC, 8443)
    for address in PRIVATE:
        assert not allowed(rules, dispatcher, address, 443), address


@pytest.mark.parametrize("folder", OVERLAYS)
def test_no_pod_reaches_the_metadata_address(folder: str) -> None:
    for name, pod in pods(folder).items():
        for address in METADATA:
            for port in (80, 443, 53, 6379, 8080, 9000):
                assert not allowed(policies(folder), pod, address, port), (name, address, port)


def test_dev_only_splatq_pods_reach_redis() -> None:
    folder = "overlays/dev"
    redis = pods(folder)["splatq-redis"]
    for other in (pods(folder)["splatq-minio"], NEIGHBOUR, STRANGER):
        assert not allowed(policies(folder), other, redis, 6379), other
    assert allowed(policies(folder), pods(folder)["splatq-dev-key"], redis, 6379)


def test_dev_minio_serves_the_storage_users_and_the_bucket_job_only() -> None:
    folder = "overlays/dev"
    minio = pods(folder)["splatq-minio"]
    assert allowed(policies(folder), pods(folder)["splatq-minio-bucket"], minio, 9000)
    for name in ("splatq-dispatcher", "splatq-settler", "splatq-redis"):
        assert not allowed(policies(folder), pods(folder)[name], minio, 9000), name


@pytest.mark.parametrize("folder", OVERLAYS)
def test_cluster_local_receivers_only_in_dev(folder: str) -> None:
    dispatcher = pods(folder)["splatq-dispatcher"]
    reaches = allowed(policies(folder), dispatcher, RECEIVER, 8000)
    assert reaches == (folder == "overlays/dev")


def test_the_evaluation_fails_when_a_policy_is_too_open() -> None:
    """The checks above can fail: without the policies everything is allowed, and the public
    internet rule without its exceptions lets the dispatcher reach the metadata address."""
    folder = "base"
    dispatcher = pods(folder)["splatq-dispatcher"]
    assert allowed([], dispatcher, METADATA[0], 80)
    opened = copy.deepcopy(policies(folder))
    for p in opened:
        for rule in p["spec"].get("egress") or []:
            for peer in rule.get("to") or []:
                peer.get("ipBlock", {}).pop("except", None)
    assert allowed(opened, dispatcher, METADATA[0], 443)
    assert allowed(opened, dispatcher, PRIVATE[0], 443)
    assert not allowed(policies(folder), dispatcher, METADATA[0], 443)
