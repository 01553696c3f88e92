"""Strict schema checks for the objects an overlay builds, offline.

Core objects: the Kubernetes OpenAPI schemas as JSON Schema, `-strict` variants (unknown
fields fail), shipped in the kubernetes-validate wheel; validators are cached per kind, since
its own `validate` re-reads the 40 MB definitions file on every call. Custom resources (KEDA,
Prometheus Operator): the cloudcoil models generated from their CRDs, with the round trip
tests/k8s/test_manifests.py uses to find fields the models silently drop.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from functools import cache
from importlib import resources
from typing import Any

import jsonschema
import referencing
from kubernetes_validate.utils import all_versions, major_minor
from pydantic import BaseModel, ValidationError


def _schema_dir(version: str) -> Any:
    best = [v for v in all_versions() if major_minor(v) <= major_minor(version)][-1]
    return (
        resources.files("kubernetes_validate") / "kubernetes-json-schema" / f"v{best}-local-strict"
    )


@cache
def _definitions(version: str) -> referencing.Resource[Any]:
    text = (_schema_dir(version) / "_definitions.json").read_text(encoding="utf-8")
    return referencing.Resource.from_contents(json.loads(text))


@cache
def _validator(version: str, kind: str, api_version: str) -> jsonschema.protocols.Validator:
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    path = _schema_dir(version) / f"{kind.lower()}-{group_version}.json"
    schema = json.loads(path.read_text(encoding="utf-8"))
    registry = _definitions(version) @ (
        referencing.Resource.from_contents(schema) @ referencing.Registry()
    )
    return jsonschema.validators.Draft202012Validator(schema, registry=registry)


def core_schema_problems(doc: dict[str, Any], version: str) -> list[str]:
    """Every place the Kubernetes `version` schema refuses `doc` ([] when it validates)."""
    validator = _validator(version, doc["kind"], doc["apiVersion"])
    name = f"{doc['kind']}/{doc['metadata']['name']}"
    return [
        f"{name}: {'.'.join(map(str, e.absolute_path))}: {e.message}"
        for e in validator.iter_errors(doc)
    ]


def crd_problems(model: type[BaseModel], doc: dict[str, Any]) -> list[str]:
    """What the CRD's generated model rejects in `doc`: validation errors, then every field it
    does not know or a value it had to coerce (a round trip that changes the document)."""
    try:
        parsed = model.model_validate(doc)
    except ValidationError as exc:
        return [f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()]
    back = parsed.model_dump(by_alias=True, exclude_unset=True, mode="json")
    return list(_differences(doc, back, ""))


def _differences(given: Any, kept: Any, path: str) -> Iterator[str]:
    if isinstance(given, dict) and isinstance(kept, dict):
        for key in given.keys() | kept.keys():
            if key not in kept:
                yield f"{path}.{key}: not in the schema"
            elif key not in given:
                yield f"{path}.{key}: added by the schema"
            else:
                yield from _differences(given[key], kept[key], f"{path}.{key}")
    elif isinstance(given, list) and isinstance(kept, list) and len(given) == len(kept):
        for i, (g, k) in enumerate(zip(given, kept, strict=True)):
            yield from _differences(g, k, f"{path}[{i}]")
    elif given != kept or type(given) is not type(kept):
        yield f"{path}: {given!r} read as {kept!r}"
