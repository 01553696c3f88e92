"""A small Python kustomize: the subset of `kustomize build` that k8s/ uses, for machines with
neither kubectl nor kustomize (neither is on PyPI, npm or Debian in a version that reads these
kustomizations). tests/deploy/test_kustomize_lite.py holds it to the real one object by object
wherever that is installed, so the two cannot drift apart unnoticed.

Supported: `resources` (files and kustomization folders), `namespace`, `labels` (metadata only:
includeSelectors and includeTemplates false), `images` (newName, newTag), config map and secret
generators (literals and files, disableNameSuffixHash), `patches` (strategic merge, with
`$patch: delete`, or JSON 6902; a target by group, version, kind and name regex). Anything else
raises NotImplementedError rather than building something different.
"""

from __future__ import annotations

import base64
import copy
import re
from pathlib import Path
from typing import Any

import yaml

KNOWN_FIELDS = frozenset(
    {
        "apiVersion",
        "kind",
        "metadata",
        "namespace",
        "labels",
        "resources",
        "images",
        "patches",
        "configMapGenerator",
        "secretGenerator",
        "generatorOptions",
    }
)
CLUSTER_SCOPED = frozenset(
    {"Namespace", "PriorityClass", "ClusterRole", "ClusterRoleBinding", "StorageClass"}
)
# Strategic merge keys of the lists k8s/ patches (Kubernetes' patchMergeKey); other lists
# are replaced whole.
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
    "topologySpreadConstraints": "topologyKey",
}
POD_SPEC_PATHS = (("spec", "template", "spec"), ("spec", "jobTemplate", "spec", "template", "spec"))

Doc = dict[str, Any]


def build(folder: Path) -> list[Doc]:
    k = yaml.safe_load((folder / "kustomization.yaml").read_text(encoding="utf-8"))
    unknown = set(k) - KNOWN_FIELDS
    if unknown:
        raise NotImplementedError(f"{folder}: {sorted(unknown)}")
    docs: list[Doc] = []
    for resource in k.get("resources", []):
        path = folder / resource
        if path.is_dir():
            docs += build(path)
        else:
            docs += [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]
    docs += _generated(folder, k)
    for patch in k.get("patches", []):
        docs = _patched(folder, docs, patch)
    for doc in docs:
        if k.get("namespace") and doc["kind"] not in CLUSTER_SCOPED:
            doc["metadata"]["namespace"] = k["namespace"]
        for entry in k.get("labels", []):
            if entry.get("includeSelectors") or entry.get("includeTemplates"):
                raise NotImplementedError("labels on selectors or templates")
            doc["metadata"].setdefault("labels", {}).update(entry["pairs"])
        for image in k.get("images", []):
            _set_image(doc, image)
    return docs


def _generated(folder: Path, k: dict[str, Any]) -> list[Doc]:
    options = k.get("generatorOptions", {})
    made = []
    for kind, key in (("ConfigMap", "configMapGenerator"), ("Secret", "secretGenerator")):
        for gen in k.get(key, []):
            gen_options = {**options, **gen.get("options", {})}
            if not gen_options.get("disableNameSuffixHash"):
                raise NotImplementedError("generated names with a hash suffix")
            data: dict[str, str] = {}
            for literal in gen.get("literals", []):
                name, _, value = literal.partition("=")
                data[name] = value
            for file in gen.get("files", []):
                name, _, path = file.rpartition("=")
                data[name or Path(path).name] = (folder / path).read_text(encoding="utf-8")
            doc: Doc = {"apiVersion": "v1", "kind": kind, "metadata": {"name": gen["name"]}}
            labels = {**options.get("labels", {}), **gen.get("options", {}).get("labels", {})}
            if labels:
                doc["metadata"]["labels"] = labels
            if kind == "Secret":
                doc["type"] = gen.get("type", "Opaque")
                data = {n: base64.b64encode(v.encode()).decode() for n, v in data.items()}
            doc["data"] = data
            made.append(doc)
    return made


def _matches(doc: Doc, target: dict[str, Any]) -> bool:
    group, _, version = doc["apiVersion"].rpartition("/")
    wanted = {"group": group, "version": version, "kind": doc["kind"]}
    for field, value in wanted.items():
        if field in target and target[field] != value:
            return False
    name = target.get("name")
    return name is None or re.fullmatch(name, doc["metadata"]["name"]) is not None


def _patched(folder: Path, docs: list[Doc], patch: dict[str, Any]) -> list[Doc]:
    text = (
        (folder / patch["path"]).read_text(encoding="utf-8") if "path" in patch else patch["patch"]
    )
    parsed = [d for d in yaml.safe_load_all(text) if d is not None]
    target = patch.get("target")
    if isinstance(parsed[0], list):  # JSON 6902
        for doc in docs:
            if _matches(doc, target):
                for op in parsed[0]:
                    _json6902(doc, op)
        return docs
    for smp in parsed:
        selector = target or {
            "kind": smp["kind"],
            "name": re.escape(smp["metadata"]["name"]),
            "group": smp["apiVersion"].rpartition("/")[0],
        }
        if smp.get("$patch") == "delete":
            docs = [d for d in docs if not _matches(d, selector)]
            continue
        body = {k: v for k, v in smp.items() if k not in {"apiVersion", "kind", "metadata"}}
        for doc in docs:
            if _matches(doc, selector):
                _merge(doc, body)
    return docs


def _merge(into: dict[str, Any], patch: dict[str, Any]) -> None:
    for key, value in patch.items():
        if value is None:
            into.pop(key, None)
        elif isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        elif isinstance(value, list) and key in MERGE_KEYS and isinstance(into.get(key), list):
            merge_key = MERGE_KEYS[key]
            existing = {item[merge_key]: item for item in into[key]}
            added = 0
            for item in value:
                if item[merge_key] in existing:
                    _merge(existing[item[merge_key]], item)
                else:  # kustomize puts the patch's new items first, in their order
                    into[key].insert(added, copy.deepcopy(item))
                    added += 1
        else:
            into[key] = copy.deepcopy(value)


def _json6902(doc: Doc, op: dict[str, Any]) -> None:
    *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
    node: Any = doc
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    match op["op"], node:
        case "add", list():
            node.insert(len(node) if last == "-" else int(last), copy.deepcopy(op["value"]))
        case "add" | "replace", dict():
            if op["op"] == "replace" and last not in node:
                raise KeyError(op["path"])
            node[last] = copy.deepcopy(op["value"])
        case "replace", list():
            node[int(last)] = copy.deepcopy(op["value"])
        case "remove", list():
            del node[int(last)]
        case "remove", dict():
            del node[last]
        case _:
            raise NotImplementedError(op)


def _set_image(doc: Doc, image: dict[str, Any]) -> None:
    for path in POD_SPEC_PATHS:
        spec: Any = doc
        for part in path:
            spec = spec.get(part) if isinstance(spec, dict) else None
        if not isinstance(spec, dict):
            continue
        for c in [*spec.get("initContainers", []), *spec.get("containers", [])]:
            name, sep, tag = c["image"].rpartition(":")
            if not sep or "/" in tag:  # untagged (a registry's port is no tag)
                name, tag = c["image"], ""
            if name == image["name"]:
                new_tag = image.get("newTag", tag)
                c["image"] = image.get("newName", name) + (f":{new_tag}" if new_tag else "")
