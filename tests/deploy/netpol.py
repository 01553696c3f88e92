"""A NetworkPolicy evaluator (networking.k8s.io/v1 semantics) for tests/deploy: may a connection
from one endpoint to another on a port happen, given the policies of an overlay?

A connection needs both ends to allow it: the source pod's egress (when any policy of its
namespace selects it for Egress) and the destination pod's ingress (likewise for Ingress).
Policies add up: one rule of one selecting policy is enough. An address outside the cluster
(`External`) is matched only by ipBlock peers; a pod only by pod/namespace selectors (as on
Cilium; other CNIs may also match pod IPs with ipBlock, which these policies never rely on).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Pod:
    namespace: str
    labels: Mapping[str, str]
    ports: Mapping[str, int] = field(default_factory=dict)  # named container ports


@dataclass(frozen=True)
class External:
    ip: str


Endpoint = Pod | External


def selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A LabelSelector: {} (or absent) selects everything."""
    if not selector:
        return True
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        present = key in labels
        ok = {
            "In": present and labels.get(key) in values,
            "NotIn": not present or labels.get(key) not in values,
            "Exists": present,
            "DoesNotExist": not present,
        }[op]
        if not ok:
            return False
    return True


def namespace_labels(namespace: str) -> dict[str, str]:
    return {"kubernetes.io/metadata.name": namespace}


def _peer_matches(peer: Mapping[str, Any], policy_ns: str, other: Endpoint) -> bool:
    if "ipBlock" in peer:
        if not isinstance(other, External):
            return False
        ip = ipaddress.ip_address(other.ip)
        block = peer["ipBlock"]
        cidr = ipaddress.ip_network(block["cidr"])
        if ip.version != cidr.version or ip not in cidr:
            return False
        excepted = (ipaddress.ip_network(e) for e in block.get("except") or [])
        return not any(ip.version == e.version and ip in e for e in excepted)
    if not isinstance(other, Pod):
        return False
    ns_selector = peer.get("namespaceSelector")
    if ns_selector is None:
        ns_ok = other.namespace == policy_ns
    else:
        ns_ok = selects(ns_selector, namespace_labels(other.namespace))
    return ns_ok and selects(peer.get("podSelector"), other.labels)


def _port_matches(
    ports: Iterable[Mapping[str, Any]] | None, port: int, protocol: str, destination: Endpoint
) -> bool:
    ports = list(ports or [])
    if not ports:
        return True
    for p in ports:
        if p.get("protocol", "TCP") != protocol:
            continue
        wanted = p.get("port")
        if wanted is None:
            return True
        if isinstance(wanted, int):
            if wanted <= port <= int(p.get("endPort", wanted)):
                return True
        elif isinstance(destination, Pod) and destination.ports.get(wanted) == port:
            return True  # a named port: the destination pod's container port of that name
    return False


def _policy_types(policy: Mapping[str, Any]) -> list[str]:
    spec = policy["spec"]
    if "policyTypes" in spec:
        return list(spec["policyTypes"])
    return ["Ingress", *(["Egress"] if "egress" in spec else [])]


def _side_allows(
    policies: Iterable[Mapping[str, Any]],
    pod: Pod,
    direction: str,
    other: Endpoint,
    port: int,
    protocol: str,
    destination: Endpoint,
) -> bool:
    selecting = [
        p
        for p in policies
        if p["metadata"].get("namespace", pod.namespace) == pod.namespace
        and selects(p["spec"].get("podSelector"), pod.labels)
        and direction in _policy_types(p)
    ]
    if not selecting:
        return True  # no policy isolates this pod in this direction
    rules_key, peers_key = ("ingress", "from") if direction == "Ingress" else ("egress", "to")
    for policy in selecting:
        policy_ns = policy["metadata"].get("namespace", pod.namespace)
        for rule in policy["spec"].get(rules_key) or []:
            peers = rule.get(peers_key)
            peer_ok = not peers or any(_peer_matches(pe, policy_ns, other) for pe in peers)
            if peer_ok and _port_matches(rule.get("ports"), port, protocol, destination):
                return True
    return False


def allowed(
    policies: Iterable[Mapping[str, Any]],
    source: Endpoint,
    destination: Endpoint,
    port: int,
    protocol: str = "TCP",
) -> bool:
    policies = list(policies)
    if isinstance(source, Pod) and not _side_allows(
        policies, source, "Egress", destination, port, protocol, destination
    ):
        return False
    return not isinstance(destination, Pod) or _side_allows(
        policies, destination, "Ingress", source, port, protocol, destination
    )
