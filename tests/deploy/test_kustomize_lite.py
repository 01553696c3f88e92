"""kustomize_lite (the builder tests/deploy falls back on without kubectl or kustomize) builds
exactly what the real kustomize builds, object by object, for every kustomization tests/deploy
reads; and refuses what it does not implement instead of building something else."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.deploy import kustomize_lite
from tests.deploy.manifests import K8S, OVERLAYS, build_with, kustomize_command

REAL = kustomize_command()


@pytest.mark.skipif(REAL is None, reason="no kubectl or kustomize to compare with")
@pytest.mark.parametrize("folder", [*OVERLAYS, "autoscaling"])
def test_the_lite_build_equals_kustomize(folder: str) -> None:
    assert REAL
    real = {(d["kind"], d["metadata"]["name"]): d for d in build_with(REAL, folder)}
    lite = {(d["kind"], d["metadata"]["name"]): d for d in kustomize_lite.build(K8S / folder)}
    assert set(lite) == set(real)
    for key, doc in real.items():
        assert lite[key] == doc, key


def test_the_lite_build_refuses_what_it_does_not_implement(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("commonLabels:\n  a: b\n", encoding="utf-8")
    with pytest.raises(NotImplementedError):
        kustomize_lite.build(tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        "secretGenerator:\n  - name: s\n    literals: [A=b]\n", encoding="utf-8"
    )
    with pytest.raises(NotImplementedError):  # a hash-suffixed name
        kustomize_lite.build(tmp_path)


def test_strategic_merge_and_json_patches(tmp_path: Path) -> None:
    (tmp_path / "d.yaml").write_text(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n"
        "spec:\n  replicas: 2\n  template:\n    spec:\n      containers:\n"
        "        - name: c\n          image: app\n          env: [{name: A, value: '1'}]\n",
        encoding="utf-8",
    )
    (tmp_path / "kustomization.yaml").write_text(
        "resources: [d.yaml]\nnamespace: ns\nimages: [{name: app, newTag: '2'}]\npatches:\n"
        "  - patch: |-\n      apiVersion: apps/v1\n      kind: Deployment\n"
        "      metadata: {name: d}\n      spec:\n        template:\n          spec:\n"
        "            containers: [{name: c, env: [{name: B, value: '2'}]}]\n"
        "  - target: {kind: Deployment, name: 'd|e'}\n"
        "    patch: '[{op: remove, path: /spec/replicas}]'\n",
        encoding="utf-8",
    )
    [doc] = kustomize_lite.build(tmp_path)
    assert doc["metadata"]["namespace"] == "ns"
    assert "replicas" not in doc["spec"]
    [c] = doc["spec"]["template"]["spec"]["containers"]
    assert c["image"] == "app:2"
    assert [e["name"] for e in c["env"]] == ["B", "A"]
